"""A local job's directory and the processes around it: what the local provider reads and kills.

A job directory holds what the runner writes (`runner.pid`, `tool.pid`, `console.log`,
`exit.json`); these helpers read those files, find a job's runner by its command line, and kill
what a runner that died left running.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil

# What an ended job's status carries of its console (JobStatus.last_output).
TAIL_BYTES = 4096
TAIL_LINES = 20


def console_tail(path: Path, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last lines of a job's console (at most `max_lines`, from its last `max_bytes`): what a
    runner printed before it died is gone with the job directory, so its end keeps them."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            raw = f.read(max_bytes)
    except OSError:
        return ()
    lines = raw.decode("utf-8", "replace").replace("\x00", "\ufffd").splitlines()  # NUL: no database holds it
    if size > max_bytes and lines:
        lines = lines[1:]  # the first is cut
    return tuple(ln for ln in lines if ln.strip())[-max_lines:]


def is_job_dir(path: Path, jobs_dir: Path) -> bool:
    """A directory this provider made: in its jobs directory, or (another JOBS_DIR setting before a
    restart) one that holds what `launch` writes first."""
    return path.resolve().parent == jobs_dir.resolve() or (path / "launch.json").is_file()


def runs_job(cmdline: list[str], job_name: str) -> bool:
    """A runner's command line names its job: `--job-name NAME`."""
    return any(cmdline[i] == "--job-name" and cmdline[i + 1] == job_name for i in range(len(cmdline) - 1))


def runner_of(pid: int, job_name: str) -> psutil.Process | None:
    """The live process `pid`, if it is the runner of `job_name` (a pid alone may have been reused)."""
    try:
        p = psutil.Process(pid)
        if p.status() != psutil.STATUS_ZOMBIE and runs_job(p.cmdline(), job_name):
            return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
    return None


def create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def kill_remains(job_dir: Path) -> None:
    """Kill what is left of a job whose runner died without stopping its tool (the tool runs in a
    process group of its own, which outlives a runner killed with SIGKILL or by the OOM killer).

    The runner wrote the group's id (the tool's pid) and when it started (`tool.pid`). The group is
    the tool's while its leader is that process (its start time matches), or while the leader is
    gone but members remain: Linux does not hand out a pid still in use as a process group id. A
    leader with another start time is someone else's process that got the number: left alone."""
    recorded = read_json(job_dir / "tool.pid")
    if not recorded or not isinstance(recorded.get("pgid"), int) or recorded["pgid"] <= 1:
        return
    pgid = recorded["pgid"]
    try:
        leader_started = psutil.Process(pgid).create_time()
    except psutil.NoSuchProcess:
        leader_started = None
    except psutil.AccessDenied:
        return
    if leader_started is not None and abs(leader_started - float(recorded.get("started_at") or 0)) > 2.0:
        return
    signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
