"""A job starts once: its runner claims the job before it does anything else (standard library only).

Where a cloud API refuses a second job of one name, a directory on a host does not: a launcher
paused between its look for the job and its start of the runner (a leader stopped past its lease)
may wake and start a second runner, after its successor looked, found nothing and started one.
So the runner itself makes the start single. With `--claim-file PATH` (the local provider's
`runner.pid`) it first links a file naming its pid to PATH, which the kernel does at most once
per PATH; a runner that finds PATH taken exits at once with `CLAIM_LOST`, having read, run and
reported nothing, and the launcher adopts the runner that holds the claim.

The check happens before the runner's own imports, so a launch waits only for the interpreter
to start (`python -m controlplane_runner` runs `claim_from_argv` first).
"""

from __future__ import annotations

import json
import os
import sys
import time

CLAIM_LOST = 75  # EX_TEMPFAIL: another runner holds the job (or another execution the attempt)
CLAIM_REFUSED = 77  # EX_NOPERM: the control plane refused the job's token, or the attempt is over
CLAIM_UNAVAILABLE = 69  # EX_UNAVAILABLE: nobody could be asked (control plane and object store)
FLAG = "--claim-file"


def claim(path: str) -> int | None:
    """Claim the job for this process: None when it is ours now, else the holder's pid (0 when
    the holder's claim cannot be read)."""
    doc = json.dumps({"pid": os.getpid(), "claimed_at": time.time()})
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    try:
        os.link(tmp, path)  # atomic, and refused when PATH exists: a complete file or none
        return None
    except FileExistsError:
        return _holder(path)
    except OSError:  # a file system without hard links: an exclusive create (briefly empty)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return _holder(path)
        with os.fdopen(fd, "w") as f:
            f.write(doc)
        return None
    finally:
        os.unlink(tmp)


def _holder(path: str) -> int:
    try:
        with open(path) as f:
            holder = json.load(f).get("pid")
    except (OSError, ValueError, AttributeError):
        holder = None
    return holder if isinstance(holder, int) else 0


def claim_from_argv(argv: list[str]) -> None:
    """Claim the job named by `--claim-file PATH` (before `--`), and say so on the job's console;
    exit with CLAIM_LOST if another runner holds it. Without the flag: nothing to do."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    path = _option(options, FLAG)
    if path is None:
        return
    job = _option(options, "--job-name") or os.path.basename(os.path.dirname(path))
    holder = claim(path)
    if holder is None:
        print(f"# started {job} at {time.time():.3f} (runner pid {os.getpid()})", flush=True)
        return
    print(f"# not started: {job} already has its runner (pid {holder}); runner pid {os.getpid()} exits",
          flush=True)
    sys.exit(CLAIM_LOST)


def _option(options: list[str], name: str) -> str | None:
    i = options.index(name) if name in options else len(options)
    return options[i + 1] if i + 1 < len(options) else None
