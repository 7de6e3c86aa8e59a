"""The `controlplane` command run in a subprocess as a user runs it, and measured: its peak RSS
(VmHWM, which starts afresh at exec; `ru_maxrss` of a child would carry over its parent's peak on
Linux) and the bytes it read through read(2) (`rchar`: imports and the file it sends; a socket's
recv is not counted). The figures are written at exit by an `atexit` hook in the same process,
so a process killed part way leaves none; while it runs, `read_bytes_so_far` follows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WRAPPER = r"""
import atexit, json, os, runpy, sys

def report():
    fig = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                fig["peak_rss_kib"] = int(line.split()[1])
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            fig[k.strip()] = int(v)
    with open(os.environ["MEASURE_TO"], "w") as f:
        json.dump(fig, f)

atexit.register(report)
sys.argv = ["controlplane", *sys.argv[1:]]
runpy.run_module("controlplane.cli", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Figures:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mib: float
    read_bytes: int  # rchar: every byte read through read(2), imports included


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The shell's environment without the server's settings, as a user's shell would have it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    return {**env, "COLUMNS": "200", **(extra or {})}


class MeasuredCli:
    """`controlplane ARGS...` started now; `finish()` waits for it and answers its figures."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        fd, self.out = tempfile.mkstemp(prefix="cp-measured-", suffix=".json")
        os.close(fd)
        self.proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *args], cwd=ROOT,
                                     env={**user_env(env), "MEASURE_TO": self.out},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read_bytes_so_far(self) -> int:
        """`rchar` of the running process (0 once it has gone)."""
        try:
            with open(f"/proc/{self.proc.pid}/io") as f:
                return next(int(line.split(":")[1]) for line in f if line.startswith("rchar:"))
        except (OSError, StopIteration):
            return 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)
        os.unlink(self.out)

    def finish(self, timeout: float = 1800) -> Figures:
        stdout, stderr = self.proc.communicate(timeout=timeout)
        try:
            fig: dict[str, Any] = json.loads(Path(self.out).read_text() or "{}")
        finally:
            os.unlink(self.out)
        return Figures(self.proc.returncode, stdout, stderr, fig.get("peak_rss_kib", 0) / 1024, fig.get("rchar", 0))


def run_cli(args: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> Figures:
    return MeasuredCli(args, env).finish(timeout)
