"""The servers the benchmark talks to, and the subprocess entry point that runs them.

* `noop_server()`: the baseline, a minimal FastMCP server with one tool that does nothing. It is
  served like the control plane (`HttpServer`): `http_app(path="/mcp")` under uvicorn, same
  uvicorn options, on a pre-bound loopback socket. That socket is made the way uvicorn makes its
  own (`tcp_socket`: protocol IPPROTO_TCP, so asyncio sets TCP_NODELAY on every connection), as
  any FastMCP server run with `transport="http"` would have it. Its tool is a plain `def`
  (fastmcp runs it in a worker thread, as the control plane's tools run their service calls)
  returning a small dict.
* the control plane, through `controlplane.serve.HttpServer` as shipped, optionally with the
  provider double of `bench.doubles` in place of the local provider. Its ready line says whether
  its listening socket is IPPROTO_TCP (see `tcp_socket` for why that matters).

`python -m bench.servers noop [--json]` and `python -m bench.servers controlplane --home DIR
[--double] [--cycles K] [--report-cycles] [--set KEY=VALUE ...]` serve until SIGTERM. Before serving, `--cycles K` runs K reconciler cycles directly
(`Reconciler.cycle_sync`, nothing else running in the process) and measures each: wall time,
process CPU time and the provider calls it made. Once the server accepts connections the process
prints one line `BENCH-READY {json}` (url, pid, cycle figures, RSS) on stdout. With
`--report-cycles` it then prints `BENCH-CYCLE {json}` after each cycle of its own reconciler loop
(jobs, wall time, the CPU time of the thread that ran it, RSS after it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/...` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from fastmcp import FastMCP  # noqa: E402

READY = "BENCH-READY "
CYCLE = "BENCH-CYCLE "


def noop_server() -> FastMCP:
    mcp = FastMCP(name="noop-baseline")

    @mcp.tool
    def noop() -> dict[str, bool]:
        """Does nothing."""
        return {"ok": True}

    return mcp


def tcp_socket(host: str, port: int) -> socket.socket:
    """A listening socket as uvicorn binds one itself (`loop.create_server(host, port)`).

    The protocol number matters: asyncio turns on TCP_NODELAY only for sockets whose `proto` is
    IPPROTO_TCP, and `socket.socket(family, SOCK_STREAM)` leaves it 0 (accepted connections
    inherit it). Without TCP_NODELAY, Nagle's algorithm holds back the response body that uvicorn
    writes after the headers until the client ACKs them, which a delayed ACK does only after
    ~40 ms: every call pays that wait.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


class NoopHttpServer:
    """`noop_server()` served like `controlplane.serve.HttpServer` serves the control plane."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, json_response: bool = False):
        import uvicorn

        self.sock = tcp_socket(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}/mcp"
        app = noop_server().http_app(path="/mcp", json_response=json_response)
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)

    async def serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    @property
    def started(self) -> bool:
        return bool(self.server.started)


def measure_cycles(cp: Any, double: Any, k: int) -> list[dict[str, Any]]:
    """Run `k` reconciler cycles back to back; the first polls jobs whose status was never
    recorded (as right after their launch), the next ones are the steady state."""
    out = []
    for i in range(k):
        double.reset()
        cpu0, t0 = time.process_time(), time.perf_counter()
        stats = cp.reconciler.cycle_sync(force_poll=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        out.append({
            "cycle": i + 1, "jobs": stats.jobs, "wall_s": wall, "cpu_s": cpu,
            "poll_calls": double.calls["poll"], "other_calls": double.calls["launch"] + double.calls["cancel"],
            "handles_polled": double.handles_polled, "largest_batch": double.largest_batch,
            "batch_size": double.poll_batch_size, "stats_provider_calls": dict(stats.provider_calls),
            "finished": stats.finished, "lost": stats.lost, "stops": stats.stops, "expired": stats.expired,
        })
    return out


def report_cycles(cp: Any) -> None:
    """Print `BENCH-CYCLE {json}` after each cycle of the server's own reconciler loop."""
    inner, me, n = cp.reconciler.cycle_sync, psutil.Process(), [0]

    def timed(force_poll: bool = False) -> Any:
        cpu0, t0 = time.thread_time(), time.perf_counter()
        stats = inner(force_poll)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        n[0] += 1
        print(CYCLE + json.dumps({"cycle": n[0], "jobs": stats.jobs, "wall_s": wall, "cpu_s": cpu,
                                  "rss": me.memory_info().rss}), flush=True)
        return stats

    cp.reconciler.cycle_sync = timed


async def serve_controlplane(home: Path, *, double: bool, batch: int, cycles: int,
                             settings: dict[str, str] | None = None, watch: bool = False) -> None:
    from bench.doubles import CountingProvider
    from controlplane.app import ControlPlane
    from controlplane.serve import HttpServer, settle_heap
    from controlplane.settings import Settings

    me = psutil.Process()
    info: dict[str, Any] = {"pid": os.getpid(), "rss_after_import": me.memory_info().rss}
    # seconds since the process started, at each step of start-up (the ready line adds "serving")
    info["startup_s"] = since = {"imported": time.time() - me.create_time()}
    provider = CountingProvider(poll_batch_size=batch) if double else None
    cp = ControlPlane(Settings(home=home, **(settings or {})), providers={"local": provider} if provider else None)
    info["rss_after_open"] = me.memory_info().rss
    since["opened"] = time.time() - me.create_time()
    http = HttpServer(cp, "127.0.0.1", 0)
    settle_heap()  # as `controlplane serve` does before it serves
    since["app_built"] = time.time() - me.create_time()
    if cycles:
        assert provider is not None, "--cycles needs --double"
        info["cycles"] = measure_cycles(cp, provider, cycles)
        info["rss_after_cycles"] = me.memory_info().rss
    if watch:
        report_cycles(cp)
    info["socket_ipproto_tcp"] = http.listener.sock.proto == socket.IPPROTO_TCP
    await _serve(http, info)


async def serve_noop(json_response: bool = False) -> None:
    http = NoopHttpServer(json_response=json_response)
    await _serve(http, {"pid": os.getpid()})


async def _serve(http: Any, info: dict[str, Any]) -> None:
    task = asyncio.create_task(http.serve())
    while not http.started:
        if task.done():
            await task  # raises what stopped it
            return
        await asyncio.sleep(0.01)
    info["url"] = http.url
    if "startup_s" in info:
        info["startup_s"]["serving"] = time.time() - psutil.Process().create_time()
    print(READY + json.dumps(info), flush=True)
    await task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["noop", "controlplane"])
    ap.add_argument("--home", type=Path)
    ap.add_argument("--double", action="store_true", help="use the counting provider double for 'local'")
    ap.add_argument("--batch", type=int, default=100, help="the double's poll_batch_size")
    ap.add_argument("--cycles", type=int, default=0, help="reconciler cycles to measure before serving")
    ap.add_argument("--report-cycles", action="store_true",
                    help="controlplane: print a BENCH-CYCLE line after each cycle of its reconciler loop")
    ap.add_argument("--json", action="store_true", help="noop: answer with application/json, not SSE")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="controlplane: a setting (controlplane.settings.Settings field)")
    args = ap.parse_args()
    if args.which == "noop":
        asyncio.run(serve_noop(args.json))
    else:
        if args.home is None:
            ap.error("controlplane needs --home")
        settings = dict(kv.split("=", 1) for kv in args.set)
        asyncio.run(serve_controlplane(args.home, double=args.double, batch=args.batch, cycles=args.cycles,
                                       settings=settings, watch=args.report_cycles))


if __name__ == "__main__":
    main()
