"""Memory per in-flight task and the reconciler at scale: `python bench/inflight.py [--quick]`.

What it measures, against issue 13's targets (SQLite):

1. Server memory per in-flight task (<= 2 KB, at 10k and 100k in flight): the RSS of a serving
   control-plane process holding N running tasks, each with an active job (`bench.seed
   .seed_inflight`), once its own reconciler loop has run a few cycles, minus the RSS of a fresh
   server of the same build (an empty home, treated the same way), over N.
2. The same beside 200k finished tasks on file (`bench.seed.seed_history`: ten days of history,
   the older ones expired): per task over a fresh server holding only that history, and the RSS
   with the history minus the RSS without it at the same N ("flat in the number of finished
   tasks stored": within FLAT_MB).
3. The reconciler cycle at 10k and 100k in flight (< 1 s of CPU at 100k): the first cycle (it
   records every job's provider status, as right after their launch) and the steady state (the
   median of the later ones), with the provider double of `bench.doubles`, which says every job
   is running (poll_batch_size 100): process CPU time, wall time, and poll calls against
   ceil(N / batch).

How: every server is `python -m bench.servers controlplane --double --cycles K --report-cycles`
in its own process, on its own home under a temporary directory, seeded in bulk through SQL
(the history once, its database file copied into each home that carries it). Before it serves,
the server runs K cycles directly (`Reconciler.cycle_sync`, nothing else running in the
process: the cycle figures of part 3). Once it serves, it answers one `list_tasks` and one
`get_task_status` over MCP, and then its own reconciler loop runs (every `reconcile_interval_s`,
2 s) while its RSS is sampled every 0.1 s; after WATCHED_CYCLES of those cycles the peak RSS
seen is the server's figure (the loop's cycles report themselves: `BENCH-CYCLE` lines with the
CPU time of the thread that ran them, also in the report). Servers run one at a time.

`--quick` (about two minutes on 2 cores) measures 10k and 30k in flight beside 50k finished
tasks. The benchmark exits 0 whether or not targets are met (MISS rows say which are not); it
exits non-zero only when something does not work (a server does not start, a call fails). The
last line of stdout is one JSON object with every figure. `bench/run.py` can call
`bench_inflight_scale(quick, tmp, console)`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/inflight.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import BenchError, ServerProc, call, helper, ready_info, standalone  # noqa: E402
from bench.seed import seed_history, seed_inflight  # noqa: E402
from bench.servers import CYCLE  # noqa: E402

KB, MB = 1024, 1024 * 1024
PER_TASK_KB = 2.0  # the target: server memory per in-flight task
CYCLE_CPU_S = 1.0  # the target: reconciler CPU per cycle at 100k in flight
FLAT_MB = 16.0  # "flat in the number of finished tasks": RSS with the history within this of without
BATCH = 100  # the provider double's poll_batch_size
DIRECT_CYCLES = 3  # cycles run directly before serving (the first, then the steady state)
WATCHED_CYCLES = 3  # cycles of the server's own loop before its RSS is taken


def _home(tmp: Path, name: str, history_db: Path | None) -> tuple[Path, Any]:
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    home = tmp / name
    settings = Settings(home=home)
    settings.ensure_home()
    if history_db is not None:
        shutil.copyfile(history_db, settings.resolved_database_url.split("///", 1)[1])
    db = Database(settings.resolved_database_url)
    db.upgrade()
    return home, db


def seed_homes(tmp: Path, sizes: list[int], history: int, seed: int, console: Any) -> dict[tuple[int, int], Any]:
    """A home for each (in flight, finished) pair: (0, 0), (0, history) and (n, 0), (n, history)
    for each n of `sizes`. Returns {(n, finished): (home, a task id in flight or None)}."""
    homes: dict[tuple[int, int], Any] = {}
    t0 = time.perf_counter()
    base, db = _home(tmp, "history-base", None)
    seed_history(db, history, seed=seed, running={}, queued=0)
    db.dispose()
    history_db = base / "controlplane.db"
    console.log(f"  seeded {history:,} finished tasks in {time.perf_counter() - t0:.1f} s")
    for n in [0, *sizes]:
        for finished in (0, history):
            t0 = time.perf_counter()
            home, db = _home(tmp, f"n{n}-h{finished}", history_db if finished else None)
            ids = seed_inflight(db, n, seed=seed) if n else []
            db.dispose()
            homes[(n, finished)] = (home, ids[len(ids) // 2] if ids else None)
            if n:
                console.log(f"  seeded {n:,} in flight{' beside the history' if finished else ''} "
                            f"in {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(base, ignore_errors=True)
    return homes


def _cycle_lines(log: Path) -> list[dict[str, Any]]:
    text = log.read_text(errors="replace")
    return [json.loads(m) for m in re.findall(re.escape(CYCLE) + r"(\{.*\})\n", text)]


async def measure_server(name: str, home: Path, task_id: str | None, n: int, tmp: Path,
                         settings: tuple[str, ...] = ()) -> dict[str, Any]:
    """One server on `home` (and `settings`, KEY=VALUE: another database): its direct cycles, then
    its RSS once serving and after its own reconciler loop has run WATCHED_CYCLES cycles."""
    proc: ServerProc = helper(name, tmp, "controlplane", "--home", str(home), "--double", "--batch", str(BATCH),
                              "--cycles", str(DIRECT_CYCLES), "--report-cycles",
                              *[a for kv in settings for a in ("--set", kv)]).start()
    try:
        await proc.wait_ready(timeout=600)
        info = ready_info(proc)
        p = psutil.Process(proc.pid)
        samples = [p.memory_info().rss]
        async with Client(info["url"], timeout=120) as client:
            page = (await call(client, "list_tasks", {"states": ["running"], "limit": 200})).data
            if len(page["tasks"]) != min(n, 200):
                raise BenchError(f"{name}: list_tasks shows {len(page['tasks'])} running tasks, not {min(n, 200)}")
            if task_id is not None:
                st = (await call(client, "get_task_status", {"task_id": task_id})).data
                if st["state"] != "running":
                    raise BenchError(f"{name}: a task in flight answers {st['state']}")
        deadline = time.monotonic() + 120 + n / 1000
        while len(_cycle_lines(proc.log)) < WATCHED_CYCLES:
            if time.monotonic() > deadline or proc.proc is None or proc.proc.poll() is not None:
                raise BenchError(f"{name}: its reconciler loop did not run {WATCHED_CYCLES} cycles")
            samples.append(p.memory_info().rss)
            await asyncio.sleep(0.1)
        samples.append(p.memory_info().rss)
    finally:
        proc.stop()
    loop_cycles = _cycle_lines(proc.log)
    bad = [c for c in loop_cycles if c["jobs"] != n]
    if bad or any(c["jobs"] != n for c in info["cycles"]):
        raise BenchError(f"{name}: a cycle saw a number of jobs other than {n}")
    allowed = math.ceil(n / BATCH)
    direct = info["cycles"]
    return {
        "n": n, "rss_mb": max(samples) / MB, "rss_last_mb": samples[-1] / MB,
        "rss_after_open_mb": info["rss_after_open"] / MB, "rss_after_direct_cycles_mb": info["rss_after_cycles"] / MB,
        "direct_cycles": direct, "loop_cycles": loop_cycles, "allowed_poll_calls": allowed,
        "polls_within_bound": all(c["poll_calls"] <= allowed for c in direct),
        "first_cycle": {k: direct[0][k] for k in ("cpu_s", "wall_s", "poll_calls")},
        "steady_cycle": {k: statistics.median(c[k] for c in direct[1:]) for k in ("cpu_s", "wall_s", "poll_calls")},
        "loop_cycle_cpu_s": statistics.median(c["cpu_s"] for c in loop_cycles),
    }


async def bench_inflight_scale(quick: bool, tmp: Path, console: Any, *, sizes: list[int] | None = None,
                               history: int | None = None, seed: int = 11) -> dict[str, Any]:
    """Every figure of this benchmark (see the module docstring), as a dict; `tmp` is a scratch
    directory (left for the caller to remove)."""
    sizes = sizes or ([10_000, 30_000] if quick else [10_000, 100_000])
    history = history if history is not None else (50_000 if quick else 200_000)
    console.log(f"[bold]in flight[/] seeding homes: {', '.join(f'{n:,}' for n in sizes)} in flight, "
                f"with and without {history:,} finished tasks")
    homes = seed_homes(tmp, sizes, history, seed, console)
    servers: dict[tuple[int, int], dict[str, Any]] = {}
    for (n, finished), (home, task_id) in homes.items():
        name = f"inflight-n{n}-h{finished}"
        console.log(f"  server with {n:,} in flight and {finished:,} finished tasks")
        servers[(n, finished)] = await measure_server(name, home, task_id, n, tmp)
        shutil.rmtree(home, ignore_errors=True)
    out: dict[str, Any] = {"sizes": sizes, "history": history, "batch": BATCH, "targets": {
        "per_task_kb": PER_TASK_KB, "cycle_cpu_s": CYCLE_CPU_S, "flat_mb": FLAT_MB}, "servers": {}, "memory": [],
        "cycles": []}
    for (n, finished), s in servers.items():
        out["servers"][f"n{n}_h{finished}"] = s
    fresh, fresh_h = servers[(0, 0)], servers[(0, history)]
    for n in sizes:
        plain, beside = servers[(n, 0)], servers[(n, history)]
        out["memory"].append({
            "n": n,
            "rss_mb": plain["rss_mb"], "fresh_rss_mb": fresh["rss_mb"],
            "per_task_kb": (plain["rss_mb"] - fresh["rss_mb"]) * MB / n / KB,
            "rss_with_history_mb": beside["rss_mb"], "fresh_with_history_rss_mb": fresh_h["rss_mb"],
            "per_task_with_history_kb": (beside["rss_mb"] - fresh_h["rss_mb"]) * MB / n / KB,
            "per_task_with_history_over_empty_kb": (beside["rss_mb"] - fresh["rss_mb"]) * MB / n / KB,
            "history_delta_mb": beside["rss_mb"] - plain["rss_mb"],
        })
        for finished, s in ((0, plain), (history, beside)):
            out["cycles"].append({"n": n, "finished": finished, "first": s["first_cycle"], "steady": s["steady_cycle"],
                                  "loop_cpu_s": s["loop_cycle_cpu_s"], "allowed_poll_calls": s["allowed_poll_calls"],
                                  "polls_within_bound": s["polls_within_bound"]})
    out["fresh_history_delta_mb"] = fresh_h["rss_mb"] - fresh["rss_mb"]
    out["verdicts"] = verdicts(out)
    out["all_pass"] = all(v["pass"] for v in out["verdicts"].values())
    return out


def verdicts(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    v: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float, limit: float, unit: str) -> None:
        v[name] = {"value": value, "limit": limit, "unit": unit, "pass": value <= limit}

    for m in r["memory"]:
        add(f"memory per in-flight task at {m['n']:,}", m["per_task_kb"], PER_TASK_KB, "KB")
        add(f"memory per in-flight task at {m['n']:,} beside the history", m["per_task_with_history_kb"],
            PER_TASK_KB, "KB")
        add(f"RSS with the history minus without, at {m['n']:,}", abs(m["history_delta_mb"]), FLAT_MB, "MB")
    big = max(r["sizes"])
    for c in r["cycles"]:
        if c["n"] == big:
            add(f"cycle CPU at {big:,}, steady{' beside the history' if c['finished'] else ''}",
                c["steady"]["cpu_s"], CYCLE_CPU_S, "s")
            add(f"cycle CPU at {big:,}, first{' beside the history' if c['finished'] else ''}",
                c["first"]["cpu_s"], CYCLE_CPU_S, "s")
        v[f"poll calls within ceil(N / batch) at {c['n']:,}{' beside the history' if c['finished'] else ''}"] = {
            "value": c["steady"]["poll_calls"], "limit": c["allowed_poll_calls"], "unit": "calls",
            "pass": c["polls_within_bound"]}
    return v


def render(r: dict[str, Any], console: Console) -> None:
    def mark(name: str) -> str:
        return "[green]ok[/]" if r["verdicts"][name]["pass"] else "[bold red]MISS[/]"

    h = r["history"]
    t = Table(title=f"Server memory per in-flight task (RSS over a fresh server; {h:,} finished tasks beside)")
    for col in ("in flight", "RSS", "fresh", "per task", "", f"RSS, {h:,} finished", "fresh, finished",
                "per task", "", "history adds", ""):
        t.add_column(col, justify="right")
    for m in r["memory"]:
        n = f"{m['n']:,}"
        t.add_row(n, f"{m['rss_mb']:.0f} MB", f"{m['fresh_rss_mb']:.0f} MB", f"{m['per_task_kb']:.2f} KB",
                  mark(f"memory per in-flight task at {n}"), f"{m['rss_with_history_mb']:.0f} MB",
                  f"{m['fresh_with_history_rss_mb']:.0f} MB", f"{m['per_task_with_history_kb']:.2f} KB",
                  mark(f"memory per in-flight task at {n} beside the history"), f"{m['history_delta_mb']:+.1f} MB",
                  mark(f"RSS with the history minus without, at {n}"))
    console.print(t)
    t = Table(title=f"Reconciler cycle (provider double: every job running, poll_batch_size {r['batch']})")
    for col in ("in flight", "finished", "first CPU", "first wall", "steady CPU", "steady wall", "loop CPU",
                "polls", "allowed", ""):
        t.add_column(col, justify="right")
    big = max(r["sizes"])
    for c in r["cycles"]:
        beside = " beside the history" if c["finished"] else ""
        verdict = mark(f"cycle CPU at {big:,}, steady{beside}") if c["n"] == big else ""
        t.add_row(f"{c['n']:,}", f"{c['finished']:,}", f"{c['first']['cpu_s'] * 1000:.0f} ms",
                  f"{c['first']['wall_s'] * 1000:.0f} ms", f"{c['steady']['cpu_s'] * 1000:.0f} ms",
                  f"{c['steady']['wall_s'] * 1000:.0f} ms", f"{c['loop_cpu_s'] * 1000:.0f} ms",
                  f"{c['steady']['poll_calls']:.0f}", f"{c['allowed_poll_calls']}",
                  verdict + ("" if c["polls_within_bound"] else " [bold red]too many polls[/]"))
    console.print(t)
    console.print("first/steady: cycles run directly before the server serves (process CPU); loop: the median "
                  "cycle of the server's own reconciler loop while it serves (CPU of its thread)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="See the module docstring of bench/inflight.py for what each figure means.")
    ap.add_argument("--quick", action="store_true", help="10k and 30k in flight beside 50k finished tasks")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    help="tasks in flight, comma-separated (default 10000,100000)")
    ap.add_argument("--history", type=int, help="finished tasks on file beside them (default 200000)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (server logs)")
    args = ap.parse_args()
    return standalone("inflight", lambda tmp, console: asyncio.run(bench_inflight_scale(
        args.quick, tmp, console, sizes=args.sizes, history=args.history, seed=args.seed)),
        render, keep=args.keep, extra={"quick": args.quick})

if __name__ == "__main__":
    sys.exit(main())
