"""A million tasks on file: `python bench/scale.py [--quick] [--tasks N] [--due N]`.

What it measures, in one run (issue 13, on SQLite), each against the issue's target:

1. The database's size per stored task at N tasks (default 1M): the file (after a WAL
   checkpoint) over N, and each table's and index's share (SQLite's `dbstat`), for ten days of
   history as `bench/seed.py`'s `seed_history` makes it (tags, events, job rows; 30% expired).
2. Start-up with N tasks on file: from starting the server process (`bench/servers.py
   controlplane --home ... --double`, the `HttpServer` that `controlplane serve --transport http`
   runs) to its first answered MCP call (`get_task_status`), target under 2 s; beside it the same
   for a 10k-task store and an empty one, so what grows with the history shows apart from imports.
3. `list_tasks` p99 (target <= 20 ms) over the N-task store for `bench/run.py`'s filters, and
   `submit_task` / `get_task_status` as ratios to a no-op fastmcp tool's p50 (`bench/servers.py`),
   on the 10k-task store and on the N-task store in the same run: the target is that the big
   store's ratios are those of the small one. Calls are interleaved round by round in a random
   order (submit to both stores, then the no-op, both statuses of the submitted tasks, the status
   of a random stored task and one list filter in turn; then both submitted tasks are cancelled,
   which keeps the queues at their seeded length), so drift hits every measure alike.
4. One expiry sweep over `--due` tasks past their ttl (default 100k; each with 5 log lines and
   a done job), with purging on (tombstones at once, the audit after 5 days): reconciler cycles
   (`Reconciler.cycle_sync`) run back to back in a fresh process until nothing is left, each
   bounded by the retention budget; per cycle its wall time, per batch (one write transaction)
   the longest, the total, and the process's peak RSS over its RSS before the sweep. Meanwhile a
   thread submits a task every 20 ms through the same store: its latencies show how long a
   submit waits behind the sweep's writes.

Servers are subprocesses on 127.0.0.1 with the provider double (`bench/doubles.py`), so the
seeded running tasks stay running. `--quick` stores 200k tasks (not 1M), sweeps 20k due tasks
and makes fewer calls; the report says so. The last line of stdout is one JSON object with every
figure; the exit code is 0 unless something did not work. `bench_scale(...)` runs all of it for
`bench/run.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/scale.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

if len(sys.argv) > 2 and sys.argv[1] == "sweep" and "--code" in sys.argv:
    # the sweep of another checkout's code (`--compare-with`): it must come first on the path
    sys.path.insert(0, sys.argv[sys.argv.index("--code") + 1])

import psutil  # noqa: E402
from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import MB, ServerProc, call, finite, helper, percentile, ready_info, standalone, summary  # noqa: E402
from bench.seed import (  # noqa: E402
    CHUNK,
    DAY,
    MAIN_OWNER,
    Seeded,
    list_variants,  # noqa: E402
    seed_history,
)

LIST_P99_MS = 20.0
STARTUP_S = 2.0
RATIO_DRIFT = 1.25  # big-store ratio / small-store ratio: "unchanged" within run-to-run noise
SMALL = 10_000
AUDIT_DAYS = 5  # the sweep's audit retention


def open_db(home: Path) -> Any:
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    settings = Settings(home=home)
    settings.ensure_home()
    db = Database(settings.resolved_database_url)
    db.upgrade()
    return db


def seed_store(home: Path, n: int, seed: int) -> tuple[Seeded, list[str], dict[str, Any]]:
    """`n` tasks of history; returns what was seeded, 200 random stored task ids and the size."""
    db = open_db(home)
    t0 = time.perf_counter()
    seeded = seed_history(db, n, seed=seed) if n else Seeded()
    seed_s = time.perf_counter() - t0
    with db.engine.connect() as c:
        c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        rng = random.Random(seed)
        top = c.exec_driver_sql("SELECT COALESCE(MAX(pk), 0) FROM tasks").scalar_one()
        pks = ",".join(str(rng.randint(1, top)) for _ in range(200)) if top else "0"
        sample = [r[0] for r in c.exec_driver_sql(f"SELECT task_id FROM tasks WHERE pk IN ({pks}) AND owner = ?",
                                                  (MAIN_OWNER,))]
        size = db_size(c, home / "controlplane.db", n)
    db.dispose()
    size["seed_s"] = seed_s
    return seeded, sample, size


def db_size(c: Any, path: Path, n: int) -> dict[str, Any]:
    """The file's bytes per task, and each table's (its indexes included) from `dbstat`."""
    file_bytes = path.stat().st_size
    out: dict[str, Any] = {"tasks": n, "file_bytes": file_bytes, "bytes_per_task": file_bytes / n if n else None}
    try:
        rows = c.exec_driver_sql("SELECT m.tbl_name, SUM(s.pgsize) FROM dbstat s JOIN sqlite_master m "
                                 "ON m.name = s.name GROUP BY m.tbl_name").all()
        out["bytes_per_task_by_table"] = {t: b / n for t, b in rows} if n else {}
        counts = {t: c.exec_driver_sql(f"SELECT COUNT(*) FROM {t}").scalar_one()
                  for t in ("task_tags", "task_events", "jobs")}
        out["rows_per_task"] = {t: k / n for t, k in counts.items()} if n else {}
    except Exception as e:  # noqa: BLE001 - an SQLite built without dbstat: the file size alone
        out["dbstat"] = f"unavailable: {e}"
    return out


# ==== 2-3: start-up and latency ====================================================================
async def start(name: str, home: Path, tmp: Path, task_id: str | None) -> tuple[ServerProc, Client, dict[str, Any]]:
    """Start a control plane on `home` and time it to its first answered call."""
    t0 = time.perf_counter()
    proc = helper(name, tmp, "controlplane", "--home", str(home), "--double").start()
    await proc.wait_ready(timeout=300)
    ready = time.perf_counter() - t0
    client = Client(ready_info(proc)["url"], timeout=60)
    await client.__aenter__()
    if task_id:
        await call(client, "get_task_status", {"task_id": task_id})
    else:
        await client.list_tools()
    first = time.perf_counter() - t0
    info = ready_info(proc)
    return proc, client, {"ready_line_s": ready, "first_call_s": first, "in_process_s": info.get("startup_s"),
                          "rss_mb": psutil.Process(proc.pid).memory_info().rss / MB,
                          "rss_after_open_mb": info["rss_after_open"] / MB}


async def bench_serving(n: int, rounds: int, budget_s: float, starts: int, tmp: Path, seed: int,
                        console: Console) -> dict[str, Any]:
    stores: dict[str, dict[str, Any]] = {}
    for key, k in (("empty", 0), ("small", SMALL), ("big", n)):
        home = tmp / f"store-{key}"
        seeded, sample, size = seed_store(home, k, seed)
        stores[key] = {"home": home, "seeded": seeded, "sample": sample, "size": size, "n": k}
        console.log(f"stored {k:,} tasks in {size['seed_s']:.1f} s"
                    + (f": {size['bytes_per_task']:.0f} B per task" if k else ""))
    out: dict[str, Any] = {"size": {k: v["size"] for k, v in stores.items() if k != "empty"}, "startup": {}}
    async with AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        for key in ("empty", "small", "big"):  # one at a time: each start-up has the machine to itself
            sample = stores[key]["sample"]
            runs = []
            for i in range(starts):  # a start-up is one sample of a noisy figure: take the median
                proc, client, figures = await start(f"{key}-{i}", stores[key]["home"], tmp,
                                                    sample[0] if sample else None)
                runs.append(figures)
                if i < starts - 1:
                    await client.__aexit__(None, None, None)
                    proc.stop()
            stack.callback(proc.stop)  # the last one serves the latency measures
            stack.push_async_callback(client.__aexit__, None, None, None)
            med = sorted(runs, key=lambda f: f["first_call_s"])[len(runs) // 2]
            out["startup"][key] = {"tasks": stores[key]["n"], "starts": len(runs), **med,
                                   "first_call_s_all": [f["first_call_s"] for f in runs]}
            clients[key] = client
            all_s = ", ".join(f"{x:.2f}" for x in out["startup"][key]["first_call_s_all"])
            console.log(f"{key} store: first call answered {med['first_call_s']:.2f} s after start "
                        f"(median of {len(runs)}: {all_s})")
        noop_runs = []
        for i in range(starts):  # the floor: a no-op fastmcp server's start-up, on the same machine now
            t0 = time.perf_counter()
            noop_proc = helper(f"noop-{i}", tmp, "noop").start()
            await noop_proc.wait_ready()
            noop = Client(ready_info(noop_proc)["url"], timeout=60)
            await noop.__aenter__()
            await call(noop, "noop", {})
            noop_runs.append(time.perf_counter() - t0)
            if i < starts - 1:
                await noop.__aexit__(None, None, None)
                noop_proc.stop()
        stack.callback(noop_proc.stop)
        stack.push_async_callback(noop.__aexit__, None, None, None)
        out["startup"]["noop"] = {"first_call_s": sorted(noop_runs)[len(noop_runs) // 2], "first_call_s_all": noop_runs,
                                  "starts": starts}
        out["latency"] = await measure(noop, clients["small"], clients["big"], stores, rounds, budget_s, seed)
    return out


async def measure(noop: Client, small: Client, big: Client, stores: dict[str, Any], rounds: int, budget_s: float,
                  seed: int) -> dict[str, Any]:
    lists = list_variants(stores["big"]["seeded"])
    small_lists = list_variants(stores["small"]["seeded"])  # the same filters over the 10k store
    sample = stores["big"]["sample"]
    rng = random.Random(seed)
    ms: dict[str, list[float]] = {}
    cps = {"small": small, "big": big}

    async def round_(i: int, record: bool) -> None:
        await asyncio.sleep(0.02)  # let the wake-ups of the last submit and cancel settle
        await call(noop, "noop", {})
        submitted = {}
        for key in rng.sample(list(cps), 2):
            a = await call(cps[key], "submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 1}})
            submitted[key] = a.data["task_id"]
            if record:
                ms.setdefault(f"submit:{key}", []).append(a.ms)
        await asyncio.sleep(0.02)
        await call(noop, "noop", {})
        lv = list(lists)[i % len(lists)]
        ops = [("noop", noop, "noop", {}),
               ("status:stored:big", big, "get_task_status", {"task_id": rng.choice(sample)}),
               ("list:" + lv, big, "list_tasks", lists[lv]), ("list_small:" + lv, small, "list_tasks", small_lists[lv])]
        ops += [(f"status:{k}", c, "get_task_status", {"task_id": submitted[k]}) for k, c in cps.items()]
        rng.shuffle(ops)
        for key, client, tool, args in ops:
            a = await call(client, tool, args)
            if record:
                ms.setdefault(key, []).append(a.ms)
                if a.tool_ms is not None:
                    ms.setdefault("tool:" + key, []).append(a.tool_ms)
        for k, c in cps.items():
            await call(c, "cancel_task", {"task_id": submitted[k], "reason": "benchmark"})

    for i in range(10):
        await round_(i, False)
    t0 = time.perf_counter()
    done = 0
    while done < rounds and (done < 3 * len(lists) or time.perf_counter() - t0 < budget_s):
        await round_(done, True)
        done += 1
    base = percentile(ms["noop"], 50)
    out: dict[str, Any] = {"rounds": done, "measure_s": time.perf_counter() - t0, "noop": summary(ms["noop"])}
    for key in ("submit", "status"):
        for k in cps:
            s = summary(ms[f"{key}:{k}"])
            s["ratio_p50"] = s["p50_ms"] / base
            out[f"{key}_{k}"] = s
        out[f"{key}_big_vs_small"] = out[f"{key}_big"]["ratio_p50"] / out[f"{key}_small"]["ratio_p50"]
    out["status_stored_big"] = {**summary(ms["status:stored:big"]),
                                "ratio_p50": percentile(ms["status:stored:big"], 50) / base}
    # beside the client's view, the p50/p99 of the tool's own duration (the list itself, without
    # MCP, transport and client: on a shared 2-core machine their tail swamps the query's)
    for key in ("list", "list_small"):
        out[key] = {k: {**summary(ms[f"{key}:{k}"]), "tool_p50_ms": percentile(ms.get(f"tool:{key}:{k}", []), 50),
                        "tool_p99_ms": percentile(ms.get(f"tool:{key}:{k}", []), 99)} for k in lists}
    return out


# ==== 4: the expiry sweep ==========================================================================
def seed_due(home: Path, due: int, seed: int) -> dict[str, Any]:
    """About `due` finished tasks past their ttl (of a history of due / 0.7 tasks, 30% of which
    are tombstones already), each with 5 log lines."""
    db = open_db(home)
    seeded = seed_history(db, int(due / 0.7), seed=seed, queued=0, running={})
    now = time.time()
    with db.write() as c:
        terminal = "('succeeded','failed','cancelled','timed_out')"
        c.exec_driver_sql(f"UPDATE tasks SET expires_at = {now - 60} WHERE state IN {terminal}")
        ids = [r[0] for r in c.exec_driver_sql(f"SELECT task_id FROM tasks WHERE state IN {terminal}")]
        lines = [(tid, s, 1, now - 3600 + s, "stdout", "info", f"line {s} of the task's log") for tid in ids
                 for s in range(1, 6)]
        for i in range(0, len(lines), CHUNK * 5):
            c.connection.driver_connection.executemany(
                "INSERT INTO task_logs (task_id, seq, attempt, ts, stream, level, message) VALUES (?,?,?,?,?,?,?)",
                lines[i : i + CHUNK * 5])
    db.dispose()
    return {"stored": seeded.n, "due": len(ids), "tombstones": seeded.by_state.get("expired", 0)}


def peak_rss() -> int:
    """This process's peak RSS. Not ru_maxrss: Linux carries the forking parent's high-water mark
    across exec (the benchmark's own, which seeded a million tasks); VmHWM is this image's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sweep_child(home: Path, max_s: float) -> dict[str, Any]:
    """Run in its own process: reconciler cycles until nothing is left to expire or purge."""
    from bench.doubles import CountingProvider
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane.store import NewTask

    me = psutil.Process()
    cp = ControlPlane(Settings(home=home, purge_after_s=0, audit_retention_s=AUDIT_DAYS * DAY),
                      providers={"local": CountingProvider()})
    rss0 = me.memory_info().rss
    stop = threading.Event()
    submits: list[float] = []

    def submitter() -> None:  # a client that keeps submitting while the sweep runs
        while not stop.is_set():
            t0 = time.perf_counter()
            r = cp.store.tasks.submit(NewTask(owner="local", tool_name="exercise", inputs_json="{}", input_size=None,
                                              provider="local", resource_class="cpu_small", priority=0, ttl_s=86400,
                                              idempotency_key=None, tags=[], resources_json="{}", max_runtime_s=60,
                                              max_attempts=1, estimate_s=1.0))
            submits.append((time.perf_counter() - t0) * 1000)
            cp.store.tasks.request_cancel(r.task.task_id, "local", "bench", {"code": "CANCELLED"})
            stop.wait(0.02)

    th = threading.Thread(target=submitter, daemon=True)
    th.start()
    cycles = []
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < max_s:
            c0 = time.perf_counter()
            stats = cp.reconciler.cycle_sync()
            cyc = {"wall_s": time.perf_counter() - c0, "expired": stats.expired, "purged": stats.purged}
            swept = getattr(stats, "retention", None)  # None before the sweep was batched
            if swept is not None:
                cyc.update(events_purged=swept.events_purged, batches=swept.batches, batches_s=swept.batches_s,
                           longest_batch_s=swept.longest_batch_s, more=swept.more)
            cycles.append(cyc)
            if not (stats.expired or stats.purged or cyc.get("events_purged") or cyc.get("more")):
                break
    finally:
        stop.set()
        th.join()
    total = time.perf_counter() - t0
    with cp.db.engine.connect() as c:
        left = c.exec_driver_sql("SELECT COUNT(*) FROM tasks WHERE state IN "
                                 "('succeeded','failed','cancelled','timed_out') AND expires_at <= ?",
                                 (time.time() - 120,)).scalar_one()
        tombstones_left = c.exec_driver_sql("SELECT COUNT(*) FROM tasks WHERE state = 'expired'").scalar_one()
        old_events_left = c.exec_driver_sql("SELECT COUNT(*) FROM task_events WHERE ts < ?",
                                            (time.time() - AUDIT_DAYS * DAY,)).scalar_one()
    cp.db.dispose()
    peak = peak_rss()
    longest = [c["longest_batch_s"] for c in cycles if c.get("longest_batch_s") is not None]
    return {"total_s": total, "cycles": len(cycles), "expired": sum(c["expired"] for c in cycles),
            "purged_tasks": sum(c["purged"] for c in cycles),
            "purged_events": sum(c.get("events_purged", 0) for c in cycles), "left_due": left,
            "tombstones_left": tombstones_left, "old_events_left": old_events_left,
            "timed_out": total >= max_s, "longest_cycle_s": max(c["wall_s"] for c in cycles),
            "longest_batch_s": max(longest) if longest else None,
            "batches": sum(c.get("batches", 0) for c in cycles) or None,
            "mean_batch_s": (sum(c.get("batches_s", 0) for c in cycles) / n_batches
                             if (n_batches := sum(c.get("batches", 0) for c in cycles)) else None),
            "rss_before_mb": rss0 / MB, "peak_rss_mb": peak / MB, "peak_over_before_mb": (peak - rss0) / MB,
            "submit_during_sweep": summary(submits), "per_cycle": cycles}


async def bench_sweep(due: int, max_s: float, tmp: Path, seed: int, console: Console,
                      code: Path | None = None) -> dict[str, Any]:
    """The sweep, in a process of its own; with `code`, that checkout's control plane sweeps."""
    name = "sweep-before" if code else "sweep"
    home = tmp / name
    t0 = time.perf_counter()
    seeded = seed_due(home, due, seed)
    console.log(f"{name} store: {seeded['due']:,} due of {seeded['stored']:,} in {time.perf_counter() - t0:.1f} s")
    argv = [sys.executable, str(Path(__file__).resolve()), "sweep", "--home", str(home), "--max-s", str(max_s)]
    argv += ["--code", str(code)] if code else []
    proc = ServerProc(name, argv, tmp / f"{name}.log", r"SWEEP (\{.*\})\n").start()
    m = await proc.wait_ready(timeout=max_s + 300)
    proc.stop()
    return {**seeded, **json.loads(m.group(1))}


# ==== all of it ====================================================================================
async def bench_scale(tmp: Path, console: Console, *, quick: bool = False, tasks: int | None = None,
                      due: int | None = None, rounds: int | None = None, budget_s: float | None = None,
                      sweep_max_s: float = 600, seed: int = 7, compare_with: Path | None = None) -> dict[str, Any]:
    """Every figure of this benchmark as one dict (what `bench/run.py` puts in its JSON line)."""
    n = tasks or (200_000 if quick else 1_000_000)
    cfg = {"quick": quick, "tasks": n, "small": SMALL, "due": due or (20_000 if quick else 100_000),
           "rounds": rounds or (150 if quick else 900), "budget_s": budget_s or (30.0 if quick else 180.0),
           "starts": 2 if quick else 5, "seed": seed}
    r: dict[str, Any] = {"benchmark": "mcp-controlplane scale", "config": cfg}
    console.log(f"[bold]1-3[/] {n:,} tasks on file: size, start-up, list and call latency")
    r.update(await bench_serving(n, cfg["rounds"], cfg["budget_s"], cfg["starts"], tmp, seed, console))
    console.log(f"[bold]4[/] expiry sweep over {cfg['due']:,} due tasks")
    r["sweep"] = await bench_sweep(cfg["due"], sweep_max_s, tmp, seed, console)
    if compare_with is not None:
        console.log(f"[bold]4[/] the same sweep with the code of {compare_with}")
        r["sweep_before"] = await bench_sweep(cfg["due"], sweep_max_s, tmp, seed, console, code=compare_with)
    r["verdicts"] = verdicts(r)
    r["all_pass"] = all(v["pass"] for v in r["verdicts"].values())
    return finite(r)


def verdicts(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float, limit: float, unit: str) -> None:
        out[name] = {"value": value, "limit": limit, "unit": unit, "pass": bool(value <= limit)}

    lat = r["latency"]
    for k, s in lat["list"].items():
        add(f"list_tasks [{k}] p99", s["p99_ms"], LIST_P99_MS, "ms")
    add("submit_task ratio, big / small store", lat["submit_big_vs_small"], RATIO_DRIFT, "x")
    add("get_task_status ratio, big / small store", lat["status_big_vs_small"], RATIO_DRIFT, "x")
    add("start-up to first call, big store", r["startup"]["big"]["first_call_s"], STARTUP_S, "s")
    add("expiry sweep left nothing due", r["sweep"]["left_due"], 0, "tasks")
    return out


def render(r: dict[str, Any], console: Console) -> None:
    cfg, lat, v = r["config"], r["latency"], r["verdicts"]
    note = " (QUICK MODE: fewer tasks than the issue's 1M, fewer calls)" if cfg["quick"] or cfg["tasks"] < 10**6 else ""
    t = Table(title=f"mcp-controlplane at scale: {cfg['tasks']:,} tasks on file{note}", title_justify="left")
    for col in ("measure", "n", "p50", "p99", "figure", "target", ""):
        t.add_column(col, justify="left" if col in ("measure", "target", "") else "right")

    def mark(key: str | None) -> str:
        return "[dim]info[/]" if key is None else "[green]PASS[/]" if v[key]["pass"] else "[bold red]MISS[/]"

    def row(label: str, s: dict[str, Any] | None, figure: str = "", target: str = "", key: str | None = None) -> None:
        s = s or {}
        p50, p99 = s.get("p50_ms"), s.get("p99_ms")
        t.add_row(escape(label), str(s.get("n", "")), "" if p50 is None else f"{p50:.2f} ms",
                  "" if p99 is None else f"{p99:.2f} ms", figure, target, mark(key))

    row("no-op tool", lat["noop"], "1.00x")
    for key, label in (("submit", "submit_task"), ("status", "get_task_status (just submitted)")):
        for k in ("small", "big"):
            s = lat[f"{key}_{k}"]
            row(f"{label}, {r['startup'][k]['tasks']:,} tasks", s, f"{s['ratio_p50']:.2f}x no-op")
        vk = f"{'submit_task' if key == 'submit' else 'get_task_status'} ratio, big / small store"
        row(f"{label}: big / small", None, f"{v[vk]['value']:.2f}x", f"<= {RATIO_DRIFT}x", vk)
    row("get_task_status (a random stored task), big", lat["status_stored_big"],
        f"{lat['status_stored_big']['ratio_p50']:.2f}x no-op")
    t.add_section()
    for k, s in lat["list"].items():
        sm = lat["list_small"][k]
        row(f"list_tasks: {k}", s, f"in tool p50 {s['tool_p50_ms']:.2f} ms, p99 {s['tool_p99_ms']:.2f} ms "
            f"(10k: {sm['tool_p50_ms']:.2f}, {sm['tool_p99_ms']:.2f}; client p99 {sm['p99_ms']:.2f})",
            f"p99 <= {LIST_P99_MS:g} ms", f"list_tasks [{k}] p99")
    t.add_section()
    st = r["startup"]["noop"]
    t.add_row("start-up to first call, no-op fastmcp server", "", "", "",
              f"{st['first_call_s']:.2f} s, median of {st['starts']}", "", mark(None))
    for k, st in r["startup"].items():
        if k == "noop":
            continue
        key = "start-up to first call, big store" if k == "big" else None
        ip = st.get("in_process_s") or {}
        steps = ", ".join(f"{k2} {v2:.2f}" for k2, v2 in ip.items())
        t.add_row(f"start-up to first call, {k} store ({st['tasks']:,} tasks)", "", "", "",
                  f"{st['first_call_s']:.2f} s, median of {st.get('starts', 1)} ({steps}; RSS {st['rss_mb']:.0f} MB)",
                  f"< {STARTUP_S:g} s" if key else "", mark(key))
    t.add_section()
    for sz in r["size"].values():
        by = sz.get("bytes_per_task_by_table") or {}
        t.add_row(f"database file, {sz['tasks']:,} tasks", "", "", "", f"{sz['bytes_per_task']:.0f} B per task",
                  ", ".join(f"{tb} {b:.0f}" for tb, b in sorted(by.items(), key=lambda x: -x[1])), mark(None))
    for key, who in (("sweep", ""), ("sweep_before", " (compared code)")):
        sw = r.get(key)
        if sw is None:
            continue
        t.add_section()
        batch = ("" if sw["longest_batch_s"] is None else f", {sw['batches']:,} batches: mean "
                 f"{sw['mean_batch_s'] * 1000:.0f} ms, longest {sw['longest_batch_s'] * 1000:.0f} ms")
        t.add_row(f"expiry sweep{who}: {sw['due']:,} due of {sw['stored']:,}", "", "", "",
                  f"{sw['total_s']:.1f} s in {sw['cycles']} cycles (longest {sw['longest_cycle_s']:.2f} s{batch}); "
                  f"{sw['expired']:,} expired, {sw['purged_tasks']:,} purged, {sw['purged_events']:,} events; "
                  f"left: {sw['tombstones_left']:,} tombstones, {sw['old_events_left']:,} old events",
                  "nothing left due", mark("expiry sweep left nothing due" if key == "sweep" else None))
        t.add_row(f"expiry sweep{who}: memory", "", "", "", f"peak RSS {sw['peak_rss_mb']:.0f} MB "
                  f"(+{sw['peak_over_before_mb']:.0f} MB over before)", "", mark(None))
        row(f"submit during the sweep{who} (store call)", sw["submit_during_sweep"])
    console.print(t)
    missed = [k for k, x in v.items() if not x["pass"]]
    console.print(f"{len(v) - len(missed)}/{len(v)} targets met"
                  + (f"; missed: {escape(', '.join(missed))}" if missed else ""))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "sweep":  # the sweep's own process (bench_sweep)
        ap = argparse.ArgumentParser()
        ap.add_argument("sweep")
        ap.add_argument("--home", type=Path, required=True)
        ap.add_argument("--max-s", type=float, default=600)
        ap.add_argument("--code", type=Path)
        a = ap.parse_args()
        print("SWEEP " + json.dumps(sweep_child(a.home, a.max_s)), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k tasks, 20k due, fewer calls")
    ap.add_argument("--tasks", type=int, help="tasks on file (default 1000000, quick 200000)")
    ap.add_argument("--due", type=int, help="tasks due for expiry in the sweep (default 100000, quick 20000)")
    ap.add_argument("--rounds", type=int, help="measured call rounds (default 900, quick 150)")
    ap.add_argument("--budget", type=float, help="stop the measured rounds after this many seconds")
    ap.add_argument("--sweep-max-s", type=float, default=600, help="give up the sweep after this long")
    ap.add_argument("--compare-with", type=Path, metavar="DIR",
                    help="also run the sweep with the control plane of another checkout (e.g. an export of main)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes and server logs")
    args = ap.parse_args()
    return standalone("scale", lambda tmp, console: asyncio.run(bench_scale(
        tmp, console, quick=args.quick, tasks=args.tasks, due=args.due, rounds=args.rounds, budget_s=args.budget,
        sweep_max_s=args.sweep_max_s, seed=args.seed, compare_with=args.compare_with)), render, keep=args.keep)

if __name__ == "__main__":
    sys.exit(main())
