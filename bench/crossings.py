"""How many of the project's files one submit and one attempt's end run code in.

`python bench/crossings.py`: builds a control plane on a throwaway home (SQLite, the local
provider, the default catalog), then records, with a profile hook on every thread, which of the
project's source files have a function called while (1) `TaskService.submit` admits and writes one
`exercise` task, and (2) the reconciler cycle that ends its attempt runs (the runner has finished;
the cycle reads its outcome and records the end). Prints the counts and the files, as JSON last.
A measure of how far one operation reaches across the code, to compare before and after a change.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

ROOTS = ("controlplane", "providers", "infra")
ALIASES = {"controlplane_providers": "providers", "controlplane_runner": "infra/runner",
           "controlplane_tools": "infra/tools"}
recording: set[str] | None = None
_repo: dict[str, str | None] = {}


def _project_file(filename: str) -> str | None:
    if filename not in _repo:
        parts = Path(filename).parts
        rel = None
        for i in range(len(parts) - 1, -1, -1):
            if parts[i] in ALIASES:  # an installed import name, not its folder
                rel = "/".join((ALIASES[parts[i]], *parts[i + 1:]))
                break
            if parts[i] in ROOTS and parts[i - 1] not in ROOTS:
                rel = "/".join(parts[i:])
                break
        _repo[filename] = rel if rel and rel.endswith(".py") else None
    return _repo[filename]


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    if recording is not None and event == "call":
        rel = _project_file(frame.f_code.co_filename)
        if rel is not None:
            recording.add(rel)


async def main() -> dict[str, Any]:
    global recording
    threading.setprofile(_hook)
    sys.setprofile(_hook)
    from controlplane import api
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        cp = ControlPlane(Settings(home=Path(tmp) / "home", scheduler_interval_s=0.1, reconcile_interval_s=0.2,
                                   heartbeat_interval_s=0.5, kill_grace_s=1.0, claim_wait_s=2.0))
        req = api.SubmitTask(tool_name="exercise", inputs={"log_lines": 2})
        cp.service.submit("bench", req)  # warm: imports and caches are not the submit's
        recording = set()
        tid = cp.service.submit("bench", req)["task_id"]
        submit_files, recording = recording, None
        for _ in range(50):
            await cp.scheduler.tick()
            task = cp.store.tasks.get(tid)
            if task is not None and task.state not in ("queued", "scheduled"):
                break
            await asyncio.sleep(0.1)
        end_files: set[str] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            recording = set()
            await cp.reconciler.cycle(force_poll=True)
            seen, recording = recording, None
            task = cp.store.tasks.get(tid)
            if task is not None and task.state in ("succeeded", "failed", "cancelled", "timed_out"):
                end_files = seen
                break
            await asyncio.sleep(0.2)
        for t in cp.store.tasks.list("bench", limit=10):  # stop what is left (the warm-up task)
            try:
                cp.service.cancel("bench", api.CancelTask(task_id=t.task_id))
            except Exception:  # noqa: BLE001 - already ended
                pass
        await cp.reconciler.cycle(force_poll=True)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    return {"submit": sorted(submit_files), "attempt_end": sorted(end_files), "task_state": str(task.state if task else None)}


if __name__ == "__main__":
    out = asyncio.run(main())
    print(f"submit crosses {len(out['submit'])} files; an attempt's end crosses {len(out['attempt_end'])} files "
          f"(task ended {out['task_state']})")
    print(json.dumps(out))
