"""Inputs by reference: a file field of a tool's input schema (a string property marked
`"x-controlplane-file": true`) holds one reference, `upload://upl_...`, `artifact://tsk_.../path`,
or an object-store or https URL under a prefix the operator allows. `Resolver` checks each one
of a submit's inputs against the store (exists, the caller may read it, not expired, complete,
within the tool's size limit) and answers the rows the task is written with; another caller's
object answers NOT_FOUND exactly as a missing one (docs/design/references.md)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from controlplane.errors import invalid, not_found
from controlplane.identity import may_read
from controlplane.scratch import overflow
from controlplane.states import FINAL
from controlplane.store import Store
from controlplane.store.inputs import ARTIFACT, InputRow

FILE_MARK = "x-controlplane-file"
UPLOAD = re.compile(r"^upload://(upl_[0-9a-f]{1,64})$")
URL = re.compile(r"^(s3|gs|az|azure|https)://[^/]+/.+$")


def file_fields(schema: dict[str, Any]) -> list[str]:
    """The input schema's top-level properties marked as files, by name."""
    props = schema.get("properties") or {}
    return sorted(k for k, v in props.items() if isinstance(v, dict) and v.get(FILE_MARK) is True)


def allowed_url(value: str, prefixes: list[str]) -> bool:
    return bool(URL.match(value)) and any(value.startswith(p) for p in prefixes)


def split_url(value: str) -> tuple[str, str]:
    """An object-store URL as (store URL, key): `s3://bucket/a/b` -> (`s3://bucket`, `a/b`); an
    https URL is read as it is (store '', key the URL)."""
    if value.startswith("https://"):
        return "", value
    scheme, rest = value.split("://", 1)
    bucket, key = rest.split("/", 1)
    return f"{scheme}://{bucket}", key


class Resolver:
    """Checks a submit's references and resolves them into `InputRow`s."""

    def __init__(self, store: Store, url_prefixes: list[str], readable: Callable[[str, str], object | None],
                 clock: Callable[[], float]):
        self.store = store
        self.url_prefixes = url_prefixes
        self.readable = readable  # the task if the caller may read it (`Access.get`), else None
        self.clock = clock

    def resolve(self, caller: str, schema: dict[str, Any], inputs: dict[str, Any], max_mb: int,
                after: tuple[str, ...] = ()) -> tuple[InputRow, ...]:
        """The rows of a submit's references; an artifact of a parent named in `after` that has
        not ended yet is recorded unresolved, to be resolved when the task is released."""
        out = []
        for field in file_fields(schema):
            value = inputs.get(field)
            if value is None:
                continue
            row = self.one(caller, field, str(value), after)
            if row.size_bytes is not None and row.size_bytes > max_mb * 1024 * 1024:
                raise invalid(f"inputs.{field}: the file is {row.size_bytes} bytes; this tool takes at most "
                              f"{max_mb} MiB", hint="split the file, or use a tool that takes larger inputs")
            out.append(row)
        return tuple(out)

    def one(self, caller: str, field: str, value: str, after: tuple[str, ...] = ()) -> InputRow:
        if m := UPLOAD.match(value):
            up = self.store.uploads.get(m.group(1))
            if (up is None or not may_read(caller, up.owner, up.team) or up.state != "complete"
                    or up.expires_at <= self.clock()):
                raise not_found(f"inputs.{field}: upload")
            return InputRow(field=field, kind="upload", ref=value, store_url=up.store_url,
                            storage_key=up.storage_key, size_bytes=up.size_bytes, sha256=up.sha256)
        if m := ARTIFACT.match(value):
            task_id, name = m.group(1), m.group(2)
            task = self.readable(caller, task_id)
            found = [a for a in self.store.artifacts.of(task_id) if a.name == name] if task is not None else []
            if not found and task_id in after and getattr(task, "state", None) not in FINAL:
                return InputRow(field=field, kind="artifact", ref=value, store_url="", storage_key="",
                                size_bytes=None, sha256=None)
            if not found:
                raise not_found(f"inputs.{field}: artifact")
            art = max(found, key=lambda a: a.attempt)
            return InputRow(field=field, kind="artifact", ref=value, store_url=art.store_url,
                            storage_key=art.storage_key, size_bytes=art.size_bytes, sha256=art.sha256)
        if allowed_url(value, self.url_prefixes):
            store_url, key = split_url(value)
            return InputRow(field=field, kind="url", ref=value, store_url=store_url, storage_key=key,
                            size_bytes=None, sha256=None)
        raise invalid(f"inputs.{field}: not a file reference (upload://upl_..., artifact://tsk_.../path, or a URL "
                      "under a prefix this server allows)", hint="see docs/design/references.md")


def check_fits(rows: tuple[InputRow, ...], scratch_mb: int | None, class_scratch_mb: int | None,
               class_name: str) -> None:
    """INVALID_REQUEST naming the sizes unless the files whose size admission knows (uploads,
    artifacts already written) fit the job's scratch disk (`scratch.overflow`). URLs and artifacts of
    unfinished parents are not counted."""
    too_big = overflow({r.field: r.size_bytes for r in rows if r.size_bytes}, scratch_mb, class_scratch_mb,
                       class_name)
    if too_big is not None:
        raise invalid(too_big[0], hint=too_big[1])
