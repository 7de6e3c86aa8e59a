"""What every benchmark script shares: its errors, percentiles and summaries, the server
subprocesses it measures (`bench.servers`) and their CPU and writes, a timed MCP call, and the
main of a standalone script (`standalone`: a clean environment, a scratch directory, the table,
the JSON line last)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from fastmcp import Client
from rich.console import Console

from bench.servers import READY

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


class BenchError(RuntimeError):
    """Something did not work: the benchmark's figures would be meaningless."""


# ==== statistics ===================================================================================
def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(ms: list[float]) -> dict[str, Any]:
    return {"n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms) if ms else math.nan, "max_ms": max(ms) if ms else math.nan}


def finite(x: Any) -> Any:
    """The result with NaN/inf (an empty sample) as null, so the JSON line is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


# ==== processes ====================================================================================
def child_env() -> dict[str, str]:
    """The environment of a server subprocess: no CONTROLPLANE_* from ours, the project importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


class ServerProc:
    """A server subprocess; its output goes to a log file, which is searched for its ready line."""

    def __init__(self, name: str, argv: list[str], log: Path, ready: str):
        self.name, self.argv, self.log, self.ready = name, argv, log, re.compile(ready)
        self.proc: subprocess.Popen[bytes] | None = None
        self.match: re.Match[str] | None = None

    def start(self) -> ServerProc:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        return self

    async def wait_ready(self, timeout: float = 120) -> re.Match[str]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.ready.search(self.log.read_text(errors="replace"))
            if m:
                self.match = m
                return m
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        tail = self.log.read_text(errors="replace")[-3000:]
        raise BenchError(f"{self.name} server did not start (exit {self.proc.poll()}):\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def helper(name: str, tmp: Path, *args: str) -> ServerProc:
    """A `bench.servers` subprocess; its ready line carries a JSON object."""
    argv = [sys.executable, "-m", "bench.servers", *args]
    return ServerProc(name, argv, tmp / f"{name}.log", re.escape(READY) + r"(\{.*\})\n")


def ready_info(proc: ServerProc) -> dict[str, Any]:
    assert proc.match is not None
    return json.loads(proc.match.group(1))


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def bytes_written(pid: int) -> int:
    """What the process has passed to write() and pwrite() so far (files and pipes, not sockets:
    Linux's wchar), or 0 where the platform does not say."""
    try:
        return int(psutil.Process(pid).io_counters().write_chars)
    except (AttributeError, psutil.Error):
        return 0


def reap_jobs(home: Path) -> None:
    """Kill any runner process (and its children) the local provider left in `home` (ours only)."""
    for pidfile in (home / "jobs").glob("*/runner.pid"):
        try:
            h = json.loads(pidfile.read_text())
            p = psutil.Process(int(h["pid"]))
            if abs(p.create_time() - float(h.get("create_time") or 0)) > 0.05:
                continue  # that pid belongs to someone else now
            for c in p.children(recursive=True):
                c.kill()
            p.kill()
        except (psutil.Error, ValueError, KeyError, OSError):
            pass


# ==== MCP calls ====================================================================================
@dataclass
class Answer:
    ms: float  # wall time of the call, as the client sees it
    data: dict[str, Any]  # the JSON answer
    tool_ms: float | None  # the time the control plane's tool itself took (its `duration` meta (ms))


async def call(client: Client, tool: str, args: dict[str, Any]) -> Answer:
    """One tool call, timed; an error answer is a BenchError."""
    t0 = time.perf_counter()
    res = await client.call_tool(tool, args, raise_on_error=False)
    ms = (time.perf_counter() - t0) * 1000
    data = res.structured_content
    if data is None:
        data = json.loads(res.content[0].text) if res.content else {}
    if res.is_error:
        raise BenchError(f"{tool}({json.dumps(args)}) answered an error: {data}")
    return Answer(ms, data, (res.meta or {}).get("duration"))


def git_state() -> dict[str, Any]:
    """The commit measured, and whether the working tree differed from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": None}
    return {"git_commit": head.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}


def standalone(name: str, measure: Callable[[Path, Console], dict[str, Any]],
               render_result: Callable[[dict[str, Any], Console], None], *, keep: bool = False,
               extra: dict[str, Any] | None = None) -> int:
    """The main of a benchmark script (`bench/scale.py`, `bench/inflight.py`, ...): an environment
    free of the caller's CONTROLPLANE_* settings, a scratch directory (removed unless `keep`),
    the table, and the JSON line last; exit 1 when something did not work."""
    for k in [k for k in os.environ if k.startswith("CONTROLPLANE_")]:
        del os.environ[k]
    console = Console(width=None if sys.stdout.isatty() else 150)
    tmp = Path(tempfile.mkdtemp(prefix=f"cp-{name}-"))
    head = {"benchmark": f"mcp-controlplane-{name}", **(extra or {})}
    t0 = time.perf_counter()
    try:
        result = measure(tmp, console)
    except BenchError as e:
        console.print(f"[bold red]benchmark failed:[/] {e}")
        print(json.dumps({**head, "error": str(e)}))
        return 1
    finally:
        if keep:
            console.log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result = {**head, **result, "elapsed_s": time.perf_counter() - t0, "env": git_state()}
    render_result(result, console)
    print(json.dumps(finite(result), separators=(",", ":"), allow_nan=False, default=str), flush=True)
    return 0
