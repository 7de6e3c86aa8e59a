"""`exercise`: a test tool whose inputs choose what it does.

sleep_s          seconds to sleep, spread over the progress steps
progress_steps   progress reports to make
log_lines        lines to print to stdout ("line <i>")
exit_code        the exit code
spawn_children   child processes, each with a grandchild, that sleep until killed; their pids
                 are printed as "child pid=<n>" and "grandchild pid=<n>"
artifact_bytes   size of a deterministic binary artifact "data.bin" (0: none)
artifact_names   small text artifacts to write under these names (relative paths, as given)
ignore_sigterm   ignore SIGTERM (tool, children and grandchildren), so only SIGKILL stops it
result           an object merged into the result
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from controlplane_runner import toolkit

SLEEPER = (
    "import os, signal, subprocess, sys, time\n"
    "if sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if sys.argv[2] == 'parent':\n"
    "    g = subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1], 'leaf', sys.argv[3]])\n"
    "    os.write(1, f'grandchild pid={g.pid}\\n'.encode())\n"
    "while True: time.sleep(1)\n"
)


def write_artifact(n: int) -> str:
    sha = hashlib.sha256()
    path = toolkit.artifact("data.bin", kind="binary", content_type="application/octet-stream")
    block = hashlib.sha256(b"exercise").digest() * (65536 // 32)
    with open(path, "wb") as f:
        left = n
        while left > 0:
            chunk = block[: min(left, len(block))]
            f.write(chunk)
            sha.update(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def main() -> int:
    inp = toolkit.inputs()
    ignore = bool(inp.get("ignore_sigterm", False))
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in range(int(inp.get("spawn_children", 0))):
        c = subprocess.Popen([sys.executable, "-c", SLEEPER, "1" if ignore else "0", "parent", SLEEPER])
        os.write(1, f"child pid={c.pid}\n".encode())  # one write: siblings share stdout

    for i in range(int(inp.get("log_lines", 0))):
        print(f"line {i}")
    sys.stdout.flush()

    steps = int(inp.get("progress_steps", 0))
    sleep_s = float(inp.get("sleep_s", 0))
    if steps:
        for s in range(1, steps + 1):
            time.sleep(sleep_s / steps)
            toolkit.progress(step=s, step_total=steps, phase="exercise", message=f"step {s} of {steps}",
                             eta_s=round(sleep_s * (steps - s) / steps, 3))
    elif sleep_s:
        time.sleep(sleep_s)

    result = {"ok": True, "steps": steps, "lines": int(inp.get("log_lines", 0))}
    artifacts = Path(os.environ.get("CONTROLPLANE_ARTIFACTS_DIR", "."))
    for name in inp.get("artifact_names") or []:
        path = artifacts / name  # deliberately unchecked: the runner must refuse what is unsafe
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"artifact {name!r}\n")
    if inp.get("artifact_bytes"):
        result["artifact_sha256"] = write_artifact(int(inp["artifact_bytes"]))
    result.update(inp.get("result") or {})
    toolkit.result(result)
    return int(inp.get("exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
