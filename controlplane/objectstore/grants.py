"""What a job may be granted in its attempt's part of the store, as signed requests.

A job that runs with no storage credential (`CONTROLPLANE_JOB_STORE_ACCESS=grants`) asks the
control plane's runner API for signed URLs, naming objects relative to its attempt's prefix
`tasks/<id>/attempts/<n>/`:

    inputs.json           GET   what the control plane wrote at launch
    result.json           PUT   the outcome document
    events/<name>         PUT   a chunk of events spilled while the callback is down
    artifacts/<path>      PUT   an artifact (a safe relative path, as `safe_artifact_name` has it)

Anything else is refused with `UnsafeKey`, so a grant can never name another attempt's or task's
key, and a job can read nothing but its own inputs. Standard library only: the runner imports the
name rules too.
"""

from __future__ import annotations

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import ObjectStore, UnsafeKey, attempt_prefix, safe_artifact_name

MAX_NAMES = 100  # names in one request


def grant_method(name: object) -> str:
    """The HTTP method a job may use on `name` ("GET" or "PUT"); UnsafeKey if none."""
    if not isinstance(name, str):
        raise UnsafeKey("a grant name must be a string")
    if name in ("inputs.json", "input_files.json"):
        return "GET"
    if name == "result.json":
        return "PUT"
    kind, _, rest = name.partition("/")
    if kind == "events" and "/" not in rest:
        safe_artifact_name(rest)
        return "PUT"
    if kind == "artifacts":
        safe_artifact_name(rest)
        return "PUT"
    if kind == "inputs" and rest and "/" not in rest:  # the file a file input refers to, by field
        return "GET"
    raise UnsafeKey("a grant names inputs.json, input_files.json, inputs/<field>, result.json, events/<name> "
                    "or artifacts/<path>")


def sign_grants(store: ObjectStore, ref: AttemptRef, names: list[str], *, expires_in: int,
                files: dict[str, tuple[ObjectStore, str]] | None = None) -> dict[str, dict[str, object]]:
    """Signed requests for `names` (checked already) of one attempt, and GETs of the files its
    task's inputs refer to (`inputs/<field>`, those in `files`; others are left out). May call out to sign (GCS
    signBlob, an Azure user delegation key): run it off the event loop. NotImplementedError when
    the store cannot sign uploads (the local store)."""
    prefix = attempt_prefix(ref)
    out: dict[str, dict[str, object]] = {}
    for name in names:
        if name.startswith("inputs/"):  # a file the task's inputs refer to (`files`: field -> store, key)
            found = (files or {}).get(name.removeprefix("inputs/"))
            if found is not None:
                url = found[0].signed_url(found[1], expires_in=expires_in, filename=found[1].rsplit("/", 1)[-1])
                out[name] = {"method": "GET", "url": url, "headers": {}, "expires_in": expires_in}
            continue
        if grant_method(name) == "GET":
            url = store.signed_url(prefix + name, expires_in=expires_in, filename=name)
            out[name] = {"method": "GET", "url": url, "headers": {}, "expires_in": expires_in}
        else:
            out[name] = {**store.signed_put(prefix + name, expires_in=expires_in).as_dict(), "expires_in": expires_in}
    return out
