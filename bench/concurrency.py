"""Throughput under concurrency: `python bench/concurrency.py [--quick] [--clients 1,4,16,64]`.

N clients call at once, each with its own fastmcp `Client` (its own connection, its own session in
the 2025-11-25 era), each calling again as soon as its answer is in, for a fixed window. What is
counted is answers per second over the window. Measures, each a ratio to a no-op tool's calls per
second measured with the same clients in the same run (targets from issue 13):

* `submit_task` (>= 0.8x): a fresh task each call; the server writes it durably (on disk before
  its id is answered), as always;
* `get_task_status` of a finished task and `get_task_result` of a succeeded one (>= 0.9x);
* in both protocol eras: 2026-07-28 (`Client(mode="auto")`) and 2025-11-25 (`mode="legacy"`).

The no-op is fastmcp's stock server with one tool that does nothing (`bench/servers.py`), served
the same way as the control plane. The control plane runs the provider double (every job
running, nothing launched), a catalog with room for every submitted task in its queue and a
history of finished tasks to read. Windows are interleaved round by round in a random order so
that drift hits every measure alike; each figure is the median over rounds. Beside each figure the
report gives the server's CPU use over the window (100% = one core: the server is the bottleneck,
as it should be for the ratio to mean something), the CPU per call of the server and of the clients
(this process), and the p50/p99 call latency. Clients and server share the machine's two cores: at
16 clients both are near one core each, so a ratio is about (no-op server + client) / (server +
client) CPU per call, and a server that costs X ms more per call loses less than X of its share.

The clients' own heap is kept out of the garbage collector's full passes while the windows run
(`clients_heap_frozen`): a pass over it stopped every client at once for 100-130 ms, several times a
window, and the server idled meanwhile.

The machine has 2 cores: the clients share them with the server. Figures mean something only as
ratios within one run. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/concurrency.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import BenchError, bytes_written, cpu_seconds, helper, percentile, ready_info  # noqa: E402

SUBMIT_RATIO = 0.8
READ_RATIO = 0.9
ERAS = {"2026-07-28": "auto", "2025-11-25": "legacy"}
MEASURES = ("noop", "submit", "status", "result")


def write_catalog(home: Path) -> None:
    """The default catalog with a queue that takes every submit of a benchmark."""
    from controlplane.catalog import default_catalog_text

    home.mkdir(parents=True, exist_ok=True)
    text = default_catalog_text().replace("max_queue_length = 1000", "max_queue_length = 10000000")
    (home / "catalog.toml").write_text(text)


def prepare_home(home: Path, history: int) -> list[str]:
    """A control-plane home whose queue takes every submit, with `history` stored tasks; returns
    the ids of succeeded tasks of the benchmark's owner (what status and result calls read)."""
    from bench.seed import MAIN_OWNER, seed_history
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    settings = Settings(home=home)
    settings.ensure_home()
    write_catalog(home)
    db = Database(settings.resolved_database_url)
    db.upgrade()
    seed_history(db, history, seed=13)
    with db.read() as c:
        done = [r[0] for r in c.exec_driver_sql(
            "SELECT task_id FROM tasks WHERE state = 'succeeded' AND owner = ? ORDER BY pk DESC LIMIT 500",
            (MAIN_OWNER,))]
    db.engine.dispose()
    if not done:
        raise BenchError("the seeded history has no succeeded task to read")
    return done


class Window:
    """N clients calling one measure as fast as they are answered, for `seconds`."""

    def __init__(self, clients: list[Client], measure: str, done_ids: list[str], seconds: float):
        self.clients, self.measure, self.done_ids, self.seconds = clients, measure, done_ids, seconds
        self.latencies: list[float] = []

    def _call(self, i: int, k: int) -> tuple[str, dict[str, Any]]:
        if self.measure == "noop":
            return "noop", {}
        if self.measure == "submit":
            return "submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 1}}
        task_id = self.done_ids[(i * 7919 + k) % len(self.done_ids)]
        return ("get_task_status" if self.measure == "status" else "get_task_result"), {"task_id": task_id}

    async def _one(self, i: int, client: Client, stop: float) -> int:
        n = 0
        while time.perf_counter() < stop:
            tool, args = self._call(i, n)
            t0 = time.perf_counter()
            res = await client.call_tool(tool, args, raise_on_error=False)
            self.latencies.append((time.perf_counter() - t0) * 1000)
            if res.is_error:
                raise BenchError(f"{tool} answered an error: {res.content[0].text if res.content else ''}")
            n += 1
        return n

    async def run(self, pid: int | Sequence[int]) -> dict[str, Any]:
        """The window's figures; `server_cpu` is the CPU of the server(s) `pid` (every replica's, summed)."""
        pids = [pid] if isinstance(pid, int) else list(pid)
        written0 = sum(map(bytes_written, pids))
        cpu0, mine0, t0 = sum(map(cpu_seconds, pids)), time.process_time(), time.perf_counter()
        stop = t0 + self.seconds
        counts = await asyncio.gather(*(self._one(i, c, stop) for i, c in enumerate(self.clients)))
        wall = time.perf_counter() - t0  # the last answers land a little after `stop`
        calls = sum(counts)
        server = sum(map(cpu_seconds, pids)) - cpu0
        written = sum(map(bytes_written, pids)) - written0
        return {"calls": calls, "wall_s": wall, "calls_per_s": calls / wall, "server_cpu": server / wall,
                # CPU per call of the server(s), and of the clients (this process: they share the 2 cores)
                "server_ms_per_call": server / max(calls, 1) * 1000,
                # what the server(s) wrote to files (the database, its WAL) per call, in KiB
                "server_write_kib_per_call": written / max(calls, 1) / 1024,
                "client_ms_per_call": (time.process_time() - mine0) / max(calls, 1) * 1000,
                "p50_ms": percentile(self.latencies, 50), "p99_ms": percentile(self.latencies, 99)}


async def open_clients(url: str, mode: str, n: int) -> tuple[list[Client], Any]:
    from contextlib import AsyncExitStack

    stack = AsyncExitStack()
    clients = []
    for _ in range(n):
        c = Client(url, mode=mode, timeout=60)
        await stack.enter_async_context(c)
        clients.append(c)
    return clients, stack


@contextmanager
def clients_heap_frozen() -> Iterator[None]:
    """The measured windows, with the clients' heap (this process: the seeding, the SDKs, the
    clients, warmed up) out of the collector's full passes, as the server's is (`settle_heap`).
    Each full pass walked it for 100-130 ms, stalling every client at once, 4-5 times in a 6 s
    window of 16 clients submitting (3 of reads): the server sat idle for 10% of the window, and
    every measure's p99 was these pauses. Unfrozen after, so that closed clients can be freed."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def close_clients(stack: Any, console: Console) -> None:
    """Disconnect a set of clients. Their figures are in by then: a client whose own teardown
    fails (fastmcp's stopped with anyio's ClosedResourceError once, closing 64 of the no-op's
    clients after their last window) is reported, and the run goes on."""
    try:
        await stack.aclose()
    except Exception as e:  # noqa: BLE001 - only the clients' teardown: nothing measured is lost
        console.log(f"closing the clients failed ({type(e).__name__}); the run goes on")


async def bench_concurrency(tmp: Path, console: Console, *, quick: bool, clients: Sequence[int] = (1, 4, 16, 64),
                            eras: Sequence[str] = tuple(ERAS), history: int = 20_000, seed: int = 7,
                            rounds: int | None = None) -> dict[str, Any]:
    """Every figure of this benchmark (what `bench/run.py` puts in its JSON line as `concurrency`).
    Seven rounds by default: one window's calls per second swings by a third on this machine (a
    no-op measured 559 to 916/s in one run), and a median of three followed it (one run's 16-client
    submit ratio was 0.71x, the next's 0.96x, same code)."""
    window, default_rounds, settle = (1.0, 2, 0.2) if quick else (2.0, 7, 0.3)
    rounds = rounds or default_rounds
    cfg = argparse.Namespace(quick=quick, clients=list(clients), eras=list(eras), history=history, seed=seed,
                             window=window, rounds=rounds, settle=settle)
    r = await bench(cfg, tmp, console)
    r["verdicts"] = verdicts(r)
    return r


async def bench(cfg: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    home = tmp / "cp"
    done_ids = prepare_home(home, cfg.history)
    noop = helper("noop", tmp, "noop").start()
    cp = helper("controlplane", tmp, "controlplane", "--home", str(home), "--double").start()
    out: dict[str, Any] = {"history": cfg.history, "window_s": cfg.window, "rounds": cfg.rounds, "eras": {}}
    try:
        await asyncio.gather(noop.wait_ready(), cp.wait_ready())
        urls = {"noop": ready_info(noop)["url"], "cp": ready_info(cp)["url"]}
        pids = {"noop": noop.pid, "cp": cp.pid}
        rng = random.Random(cfg.seed)
        for era in cfg.eras:
            mode = ERAS[era]
            out["eras"][era] = {}
            for n in cfg.clients:
                console.log(f"{era}: {n} client(s)")
                noop_clients, noop_stack = await open_clients(urls["noop"], mode, n)
                cp_clients, cp_stack = await open_clients(urls["cp"], mode, n)
                try:
                    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MEASURES}
                    for m in MEASURES:  # warm-up: every client makes a few calls of each kind
                        await Window(noop_clients if m == "noop" else cp_clients, m, done_ids, 0.3).run(
                            pids["noop" if m == "noop" else "cp"])
                    with clients_heap_frozen():
                        for _ in range(cfg.rounds):
                            for m in rng.sample(MEASURES, len(MEASURES)):
                                server = "noop" if m == "noop" else "cp"
                                w = Window(noop_clients if server == "noop" else cp_clients, m, done_ids,
                                           cfg.window)
                                runs[m].append(await w.run(pids[server]))
                                await asyncio.sleep(cfg.settle)  # let the scheduler catch up after submits
                finally:
                    await close_clients(cp_stack, console)
                    await close_clients(noop_stack, console)
                out["eras"][era][str(n)] = summarize(runs)
        return out
    finally:
        cp.stop()
        noop.stop()


def median(xs: list[float]) -> float:
    return percentile(xs, 50)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for m, rs in runs.items():
        res[m] = {"calls_per_s": median([r["calls_per_s"] for r in rs]),
                  "server_cpu": median([r["server_cpu"] for r in rs]),
                  "server_ms_per_call": median([r["server_ms_per_call"] for r in rs]),
                  "server_write_kib_per_call": median([r["server_write_kib_per_call"] for r in rs]),
                  "client_ms_per_call": median([r["client_ms_per_call"] for r in rs]),
                  "p50_ms": median([r["p50_ms"] for r in rs]), "p99_ms": median([r["p99_ms"] for r in rs]),
                  "rounds": [round(r["calls_per_s"], 1) for r in rs]}
    base = res["noop"]["calls_per_s"]
    for m in MEASURES[1:]:
        res[m]["ratio"] = res[m]["calls_per_s"] / base
    return res


def verdicts(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for era, by_n in r["eras"].items():
        s = by_n.get("16")
        if s is None:
            continue
        for m, target in (("submit", SUBMIT_RATIO), ("status", READ_RATIO), ("result", READ_RATIO)):
            out[f"{era} 16 clients {m} / no-op calls/s"] = {"value": s[m]["ratio"], "limit": target,
                                                            "pass": bool(s[m]["ratio"] >= target)}
    return out


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title="calls per second with N concurrent clients (ratio to the no-op's, same clients, same run)",
              title_justify="left")
    for col in ("era", "clients", "measure", "calls/s", "ratio", "server CPU", "server ms/call", "client ms/call",
                "KiB written/call",
                "p50 ms", "p99 ms"):
        t.add_column(col, justify="left" if col in ("era", "measure") else "right")
    for era, by_n in r["eras"].items():
        for n, s in by_n.items():
            for m in MEASURES:
                x = s[m]
                ratio = f"{x['ratio']:.2f}x" if "ratio" in x else ""
                t.add_row(era, n, m, f"{x['calls_per_s']:.0f}", ratio, f"{x['server_cpu'] * 100:.0f}%",
                          f"{x['server_ms_per_call']:.2f}", f"{x['client_ms_per_call']:.2f}",
                          f"{x['server_write_kib_per_call']:.1f}",
                          f"{x['p50_ms']:.1f}", f"{x['p99_ms']:.1f}")
    console.print(t)
    for name, v in r["verdicts"].items():
        console.print(f"{'ok  ' if v['pass'] else 'MISS'} {name}: {v['value']:.2f} (target >= {v['limit']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter windows, fewer rounds")
    ap.add_argument("--clients", default="1,4,16,64", help="comma-separated client counts")
    ap.add_argument("--eras", default=",".join(ERAS), help="comma-separated protocol eras")
    ap.add_argument("--history", type=int, default=20_000, help="stored tasks")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=None, help="windows per measure (default 7; --quick 2)")
    cfg = ap.parse_args()
    console = Console(stderr=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-conc-"))
    t0 = time.perf_counter()
    try:
        r = asyncio.run(bench_concurrency(tmp, console, quick=cfg.quick, clients=[int(x) for x in cfg.clients.split(",")],
                                          eras=[e for e in cfg.eras.split(",") if e], history=cfg.history,
                                          seed=cfg.seed, rounds=cfg.rounds))
    except BenchError as e:
        console.print(f"[red]benchmark failed:[/] {e}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r["elapsed_s"] = time.perf_counter() - t0
    render(r, console)
    print(json.dumps({"benchmark": "mcp-controlplane-concurrency", **r}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
