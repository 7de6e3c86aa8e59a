"""A tiny helper for Python tools run by the runner (the raw contract is in `controlplane_runner`).

    from controlplane_runner import toolkit
    inputs = toolkit.inputs()
    toolkit.progress(step=3, step_total=10, phase="relax", message="E=-12.3")
    path = toolkit.artifact("opt.xyz", kind="trajectory")   # write the file there
    toolkit.result({"energy": -12.3})

Outside a job (no CONTROLPLANE_* variables) inputs() is empty, progress() does nothing and
artifacts and the result go to the current directory, so a tool can be run by hand.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, TextIO

_lock = threading.Lock()
_channel: TextIO | None = None


def _progress_channel() -> TextIO | None:
    global _channel
    if _channel is None:
        fd = os.environ.get("CONTROLPLANE_PROGRESS_FD")
        if fd is None:
            return None
        _channel = os.fdopen(int(fd), "w", buffering=1)
    return _channel


def _send(msg: dict[str, Any]) -> None:
    ch = _progress_channel()
    if ch is None:
        return
    with _lock:
        try:
            ch.write(json.dumps(msg, separators=(",", ":")) + "\n")
        except (BrokenPipeError, OSError):
            pass


def inputs() -> dict[str, Any]:
    path = os.environ.get("CONTROLPLANE_INPUTS_FILE")
    if not path:
        return {}
    values: dict[str, Any] = json.loads(Path(path).read_text())
    return values


def input_path(field: str) -> Path:
    """The local file an input marked `"x-controlplane-file": true` refers to: the runner has
    fetched and checked it before the tool started, and the input's value is its path."""
    value = inputs().get(field)
    if not isinstance(value, str):
        raise KeyError(f"no file input '{field}'")
    return Path(value)


def progress(percent: float | None = None, *, step: int | None = None, step_total: int | None = None,
             phase: str | None = None, message: str | None = None, eta_s: float | None = None) -> None:
    """Report progress. percent is derived from step/step_total when not given."""
    if percent is None and step is not None and step_total:
        percent = round(100.0 * step / step_total, 3)
    msg = {"percent": percent, "step": step, "step_total": step_total, "phase": phase,
           "message": message, "eta_s": eta_s}
    _send({k: v for k, v in msg.items() if v is not None})


def artifact(name: str, *, kind: str | None = None, content_type: str | None = None) -> Path:
    """The path to write artifact `name` to; `kind` (e.g. "trajectory") is recorded with it."""
    directory = Path(os.environ.get("CONTROLPLANE_ARTIFACTS_DIR", "."))
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    decl: dict[str, Any] = {"type": "artifact", "name": name}
    if kind:
        decl["kind"] = kind
    if content_type:
        decl["content_type"] = content_type
    _send(decl)
    return path


def result(value: dict[str, Any]) -> None:
    """Record the task's result (a JSON object)."""
    path = Path(os.environ.get("CONTROLPLANE_RESULT_FILE", "result.json"))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
