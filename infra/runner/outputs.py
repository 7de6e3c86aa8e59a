"""What the tool leaves behind when it ends: its result file read, and the files of its artifacts
directory uploaded to the object store as the attempt's artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import (
    ObjectExists,
    ObjectStore,
    UnsafeKey,
    artifact_key,
    guess_content_type,
    safe_artifact_name,
)
from controlplane_runner import events
from controlplane_runner.granted import NoGrant
from controlplane_runner.relay import Emit

KINDS = {
    ".xyz": "trajectory", ".traj": "trajectory", ".dcd": "trajectory", ".pdb": "structure",
    ".cif": "structure", ".json": "data", ".csv": "table", ".parquet": "table", ".png": "image",
    ".jpg": "image", ".svg": "image", ".log": "log", ".txt": "text", ".bin": "binary",
}


def read_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The tool's result and the error to report: (None, None) when it wrote none, (None, why)
    when what it wrote is not a JSON object."""
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, "the tool's result file is not valid JSON"
    if not isinstance(data, dict):
        return None, "the tool's result must be a JSON object"
    return data, None


def upload_artifacts(store: ObjectStore | None, ref: AttemptRef, directory: Path,
                     declared: dict[str, dict[str, Any]], emit: Emit) -> list[dict[str, Any]]:
    """Each regular file under `directory` put under the attempt's artifact key, its kind and
    content type as the tool declared them (else guessed from its name); the outcome's entries
    of those uploaded. A file with an unsafe name, one already uploaded, or one the control plane
    grants no upload for is skipped with a warning log event."""
    out: list[dict[str, Any]] = []
    if store is None:
        return out
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(directory).as_posix()
        try:
            name = safe_artifact_name(rel)
        except UnsafeKey as e:
            emit(events.log(f"runner: artifact {rel!r} skipped: {e}", stream=events.STDERR, level=events.WARNING))
            continue
        decl = declared.get(name, {})
        ctype = decl.get("content_type") or guess_content_type(name)
        key = artifact_key(ref, name)
        try:
            info = store.put_file(key, str(path), content_type=ctype)
        except ObjectExists:
            emit(events.log(f"runner: artifact {name!r} already uploaded; kept the first",
                            stream=events.STDERR, level=events.WARNING))
            continue
        except NoGrant as e:
            emit(events.log(f"runner: artifact {name!r} not uploaded: {e}", stream=events.STDERR, level=events.WARNING))
            continue
        assert info.sha256 is not None  # a put hashes what it writes
        out.append(events.artifact(name=name, kind=decl.get("kind") or kind_of(name), key=key,
                                   size_bytes=info.size_bytes, sha256=info.sha256, content_type=ctype))
    return out


def kind_of(name: str) -> str:
    """An artifact's kind by its file name's suffix ("file" when it is none of KINDS)."""
    return KINDS.get(Path(name).suffix.lower(), "file")
