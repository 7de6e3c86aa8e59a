"""Process-tree control for the runner (docs/design/errors-and-cancellation.md), standard library only.

The tool is started as the leader of its own process group; stopping it sends SIGTERM to the
group, waits a grace period, then sends SIGKILL to the group. On Linux the runner is also a
child subreaper, so descendants that escaped the group (setsid, double fork) are re-parented to
the runner and are found and killed too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        became: bool = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        return became
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (Linux /proc walk; empty elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields after the last ')' are fixed.
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) < 2 or rest[0] == "Z":
            continue
        children.setdefault(int(rest[1]), []).append(int(entry))
    out: list[int] = []
    stack = [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def reap() -> None:
    """Collect exit statuses of re-parented orphans so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(pgid: int, grace_s: float, own_pid: int | None = None) -> None:
    """SIGTERM the group (and escaped descendants), wait up to grace_s, then SIGKILL."""
    own_pid = own_pid or os.getpid()
    signal_group(pgid, signal.SIGTERM)
    for pid in descendants(own_pid):
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not group_alive(pgid) and not descendants(own_pid):
            return
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)
    for pid in descendants(own_pid):
        _kill(pid, signal.SIGKILL)
    end = time.monotonic() + 5
    while time.monotonic() < end and (group_alive(pgid) or descendants(own_pid)):
        reap()
        time.sleep(0.02)
    reap()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
