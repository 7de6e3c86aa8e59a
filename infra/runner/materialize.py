"""File inputs made local before the tool starts: each reference the control plane resolved
(`input_files.json` beside the attempt's inputs) is streamed from its store into
`<workdir>/inputs/<field>/<name>` through a fixed buffer, hashed on the way and checked against
the recorded sha256 and size, and the tool's input value becomes that path."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, Any

from controlplane.objectstore.base import CHUNK, ObjectStore, input_files_key, open_store

# The job's env says whether the task has file inputs ("1"), set by the launch only then: without
# it the runner does not look for `input_files.json` (no GET of it, no grant asked for it).
INPUT_FILES_ENV = "CONTROLPLANE_INPUT_FILES"
Open = Callable[[str, dict[str, Any]], IO[bytes]]  # (field, where its file is) -> a readable stream


class InputMismatch(Exception):
    """A file's bytes are not those admission recorded."""


def opener(own: ObjectStore | None, own_url: str | None) -> Open:
    """Reads through the runner's own store when the file is there, else through a store opened
    for the file's URL (the job's identity), or over https."""
    opened: dict[str, ObjectStore] = {}

    def open_(field: str, f: dict[str, Any]) -> IO[bytes]:
        store_url, key = f["store_url"], f["key"]
        if not store_url:
            stream: IO[bytes] = urllib.request.urlopen(key, timeout=60)  # noqa: S310 - an operator-allowed prefix
            return stream
        if own is not None and store_url == own_url:
            return own.open(key)
        if store_url not in opened:
            opened[store_url] = open_store(store_url)
        return opened[store_url].open(key)
    return open_


def manifest(store: ObjectStore, ref: Any) -> dict[str, dict[str, Any]]:
    """The attempt's file inputs, or {} when it has none."""
    key = input_files_key(ref)
    if getattr(store, "granted", False):  # it cannot stat: the control plane says whether there is one
        stream = store.input_files()  # type: ignore[attr-defined]
        if stream is None:
            return {}
    elif store.stat(key) is None:
        return {}
    else:
        stream = store.open(key)
    with stream as f:
        data: dict[str, dict[str, Any]] = json.loads(f.read())
    return data


def materialize(files: dict[str, dict[str, Any]], inputs: dict[str, Any], workdir: Path, open_: Open) -> int:
    """Each file under `workdir/inputs/<field>/`, its input value replaced by the local path.
    Returns the bytes written (what the files take of the job's scratch disk)."""
    total = 0
    for field, f in sorted(files.items()):
        name = PurePosixPath(f["key"].split("?", 1)[0]).name or "input"
        dest = workdir / "inputs" / field / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        sha, size = hashlib.sha256(), 0
        with open_(field, f) as src, open(dest, "wb") as out:
            while chunk := src.read(CHUNK):
                sha.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if (f.get("sha256") and sha.hexdigest() != f["sha256"]) or f.get("size_bytes") not in (None, size):
            dest.unlink(missing_ok=True)
            raise InputMismatch(f"input {field}: the file read does not match its recorded size and sha256")
        inputs[field] = str(dest)
        total += size
    return total
