"""Several replicas on PostgreSQL against SQLite: `python bench/replicas.py [--quick]`.

What it measures (issue 14), each beside its baseline in the same run:

1. `submit_task` and `get_task_status` p50 over MCP (one client, one call at a time) on a control
   plane on SQLite and one on PostgreSQL, as ratios to a fastmcp no-op call's p50.
2. Submits per second with 16 clients: on SQLite (one server) and on PostgreSQL with 1, 2 and 3
   replicas (the clients spread over them round-robin), as ratios to the no-op's calls per second
   with 16 clients; the servers' CPU summed beside each.
3. The reconciler cycle at 10k in flight, PostgreSQL against SQLite (`bench/inflight.py`'s server
   with the provider double: the first cycle, which records every job's status, and the steady
   state's median): CPU and wall time.
4. Progress latency across replicas (p50/p99): a probe tool on the leader reports steps stamped
   with their time (`bench/protocol.py`), followed with `wait_task` on a second replica, whose
   notifications come through LISTEN/NOTIFY; beside the same tasks followed on the leader itself.
5. What the lease fence costs per launch (in-process, on each engine): the check before the
   provider call (`LeaseStore.holds`, a transaction of its own) and the check inside the claim
   and inside the record of the launch, against the same claim and record unfenced.
6. Whether NOTIFY serialises commits on PostgreSQL (at commit, a transaction that notified takes
   a lock of the whole database's notification queue, held until its commit record is flushed):
   16 threads committing one-row updates, each with and without the store's NOTIFY of the task.

The servers are subprocesses on 127.0.0.1 (`bench/servers.py`); the control planes of parts 1-3
run the provider double (nothing is launched), part 4 the real local provider. PostgreSQL is a
throwaway cluster (`tests/postgres.py`) started with its durable defaults (fsync and synchronous
commit on), as SQLite syncs every commit (synchronous=FULL); both on the same disk. Figures mean
something only as ratios within one run, on a machine that may be shared. `--quick` shortens
every window. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/replicas.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.concurrency import Window, clients_heap_frozen, open_clients, write_catalog  # noqa: E402
from bench.harness import BenchError, ServerProc, call, helper, percentile, ready_info, reap_jobs, standalone, summary  # noqa: E402

CLIENTS = 16
INFLIGHT = 10_000


def sets(*kv: str) -> list[str]:
    return [a for x in kv for a in ("--set", x)]


def cp_server(name: str, tmp: Path, url: str | None) -> ServerProc:
    """A control plane with the provider double on its own home (and on `url`, else SQLite)."""
    home = tmp / name
    write_catalog(home)
    return helper(name, tmp, "controlplane", "--home", str(home), "--double",
                  *sets(*([f"database_url={url}"] if url else []))).start()


async def started(*procs: ServerProc) -> list[str]:
    await asyncio.gather(*(p.wait_ready() for p in procs))
    return [ready_info(p)["url"] for p in procs]


# ---- 1 and 2: calls over MCP ----------------------------------------------------------------
async def latencies(urls: dict[str, str], calls: int, rounds: int, rng: random.Random) -> dict[str, Any]:
    """p50 of sequential calls: the no-op, and submit and status on each engine's control plane."""
    samples: dict[str, list[float]] = {}
    async with AsyncExitStack() as stack:
        clients = {k: await stack.enter_async_context(Client(u, timeout=60)) for k, u in urls.items()}
        done: dict[str, str] = {}
        for eng in ("sqlite", "postgres"):  # a task to read, and a warm-up of every call
            done[eng] = (await call(clients[eng], "submit_task", {"tool_name": "exercise", "inputs": {}})).data["task_id"]
            for _ in range(20):
                await call(clients[eng], "get_task_status", {"task_id": done[eng]})
        for _ in range(20):
            await call(clients["noop"], "noop", {})
        measures = ["noop"] + [f"{e}.{m}" for e in ("sqlite", "postgres") for m in ("submit", "status")]
        for _ in range(rounds):
            for m in rng.sample(measures, len(measures)):
                eng, _, what = m.partition(".")
                for _ in range(calls):
                    if m == "noop":
                        a = await call(clients["noop"], "noop", {})
                    elif what == "submit":
                        a = await call(clients[eng], "submit_task", {"tool_name": "exercise", "inputs": {}})
                    else:
                        a = await call(clients[eng], "get_task_status", {"task_id": done[eng]})
                    samples.setdefault(m, []).append(a.ms)
    base = percentile(samples["noop"], 50)
    return {m: {**summary(xs), "ratio_p50": percentile(xs, 50) / base} for m, xs in samples.items()}


async def throughput(noop: ServerProc, sqlite: ServerProc, pg: list[ServerProc], window: float, rounds: int,
                     rng: random.Random) -> dict[str, Any]:
    """Submits per second with CLIENTS clients: SQLite, and PostgreSQL on 1, 2 and 3 replicas."""
    setups: dict[str, list[ServerProc]] = {"noop": [noop], "sqlite": [sqlite],
                                           **{f"postgres x{n}": pg[:n] for n in range(1, len(pg) + 1)}}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in setups}
    async with AsyncExitStack() as stack:
        clients: dict[str, list[Client]] = {}
        for key, procs in setups.items():
            per = []
            for i, p in enumerate(procs):  # the clients, round-robin over the replicas
                n = len(range(i, CLIENTS, len(procs)))
                cs, s = await open_clients(ready_info(p)["url"], "auto", n)
                stack.push_async_callback(s.aclose)
                per += cs
            clients[key] = per
        for key in setups:  # warm-up
            await Window(clients[key], "noop" if key == "noop" else "submit", [], 0.3).run([p.pid for p in setups[key]])
        with clients_heap_frozen():
            for _ in range(rounds):
                for key in rng.sample(list(setups), len(setups)):
                    w = Window(clients[key], "noop" if key == "noop" else "submit", [], window)
                    runs[key].append(await w.run([p.pid for p in setups[key]]))
                    await asyncio.sleep(0.3)
    out: dict[str, Any] = {}
    base = statistics.median(r["calls_per_s"] for r in runs["noop"])
    for key, rs in runs.items():
        cps = statistics.median(r["calls_per_s"] for r in rs)
        out[key] = {"calls_per_s": cps, "ratio": cps / base, "server_cpu": statistics.median(r["server_cpu"] for r in rs),
                    "p50_ms": statistics.median(r["p50_ms"] for r in rs), "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                    "rounds": [round(r["calls_per_s"], 1) for r in rs]}
    return out


# ---- 3: the reconciler at 10k in flight -------------------------------------------------------
async def reconciler_cycles(tmp: Path, pg_url: str, n: int) -> dict[str, Any]:
    from bench.inflight import measure_server
    from bench.seed import seed_inflight
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    out = {}
    for eng, url in (("sqlite", None), ("postgres", pg_url)):
        home = tmp / f"inflight-{eng}"
        settings = Settings(home=home)
        settings.ensure_home()
        db = Database(url or settings.resolved_database_url)
        db.upgrade()
        ids = seed_inflight(db, n, seed=11)
        db.dispose()
        r = await measure_server(f"inflight-{eng}", home, ids[n // 2], n, tmp,
                                 settings=(f"database_url={url}",) if url else ())
        out[eng] = {"first": r["first_cycle"], "steady": r["steady_cycle"], "polls_within_bound": r["polls_within_bound"]}
    for k in ("first", "steady"):
        out[f"{k}_cpu_ratio"] = out["postgres"][k]["cpu_s"] / out["sqlite"][k]["cpu_s"]
        out[f"{k}_wall_ratio"] = out["postgres"][k]["wall_s"] / out["sqlite"][k]["wall_s"]
    return out


# ---- 4: progress across replicas --------------------------------------------------------------
async def progress_across(tmp: Path, pg_url: str, tasks: int, steps: int, interval: float) -> dict[str, Any]:
    import psycopg

    from bench.protocol import controlplane, follow_probes

    a = controlplane("progress-a", tmp, f"database_url={pg_url}").start()
    b: ServerProc | None = None
    try:
        await a.wait_ready()
        deadline = time.monotonic() + 30
        while True:  # A leads (it launches the probes, their runners report to it), then B starts
            with psycopg.connect(pg_url) as c:
                row = c.execute("SELECT holder FROM leases WHERE name = 'leader' AND expires_at > %s",
                                (time.time(),)).fetchone()
            if row and int(row[0].split(":")[1]) == a.pid:
                break
            if time.monotonic() > deadline:
                raise BenchError("the first replica never took the leader lease")
            await asyncio.sleep(0.1)
        b = controlplane("progress-b", tmp, f"database_url={pg_url}").start()
        url_a, url_b = ready_info(a)["url"], (await started(b))[0]
        same: list[float] = []
        across: list[float] = []
        for _ in range(2):  # alternated, so that drift hits both alike
            same += (await follow_probes(url_a, url_a, tasks, steps, interval))[0]
            across += (await follow_probes(url_a, url_b, tasks, steps, interval))[0]
    finally:
        for p in (a, b):
            if p is not None:
                p.stop()
        for name in ("progress-a", "progress-b"):
            reap_jobs(tmp / name)
    return {"same_replica": summary(same), "across_replicas": summary(across),
            "ratio_p50": percentile(across, 50) / percentile(same, 50)}


# ---- 5: the fence per launch ------------------------------------------------------------------
def fence_cost(url: str, n: int) -> dict[str, Any]:
    """Per launch, the database's share of the launch path (claim one task, record its launch),
    unfenced and fenced, and the transaction of the last check before the provider call."""
    from controlplane.store import Store
    from controlplane.store.db import Database
    from controlplane.store.leases import Fence
    from tests.test_states import new_task

    db = Database(url)
    db.upgrade()
    store = Store(db)
    try:
        epoch = store.leases.acquire("leader", "bench", 3600)
        assert epoch is not None
        fence = Fence("leader", "bench", epoch)
        for _ in range(2 * n + 20):
            store.tasks.submit(new_task())
        t: dict[str, list[float]] = {"claim": [], "claim_fenced": [], "record": [], "record_fenced": [], "holds": []}

        def launch(fenced: bool) -> None:
            f = fence if fenced else None
            t0 = time.perf_counter()
            [(_task, job)] = store.jobs.claim_for_launch("cpu_small", 10**9, 1, f)
            t1 = time.perf_counter()
            if fenced:
                store.leases.holds(fence, 1.0)
            t2 = time.perf_counter()
            store.jobs.record_launch(job.job_id, {"job": job.job_name, "double": True}, f)
            t3 = time.perf_counter()
            sfx = "_fenced" if fenced else ""
            t["claim" + sfx].append((t1 - t0) * 1000)
            t["record" + sfx].append((t3 - t2) * 1000)
            if fenced:
                t["holds"].append((t2 - t1) * 1000)

        for i in range(10):  # warm-up
            launch(i % 2 == 0)
        for k in t:
            t[k].clear()
        for i in range(2 * n):
            launch(i % 2 == 0)
    finally:
        db.dispose()
    p50 = {k: percentile(v, 50) for k, v in t.items()}
    plain = p50["claim"] + p50["record"]
    fenced = p50["claim_fenced"] + p50["holds"] + p50["record_fenced"]
    return {"p50_ms": p50, "launch_db_ms": plain, "launch_db_fenced_ms": fenced, "ratio": fenced / plain,
            "added_ms": fenced - plain}


# ---- 6: NOTIFY and commits on PostgreSQL ------------------------------------------------------
def notify_commits(url: str, threads: int, window: float, rounds: int) -> dict[str, Any]:
    """Commits per second of `threads` writers, each updating its own task row, with the store's
    NOTIFY of that task in the transaction and without (interleaved rounds)."""
    from sqlalchemy import text

    from controlplane.store import Store
    from controlplane.store.db import Database
    from tests.test_states import new_task

    db = Database(url)
    store = Store(db)
    try:
        ids = [store.tasks.submit(new_task()).task.task_id for _ in range(threads)]
        update = text("UPDATE tasks SET updated_at = :now WHERE task_id = :id")

        def window_of(notify: bool) -> float:
            stop = time.perf_counter() + window
            counts = [0] * threads
            gate = threading.Barrier(threads)

            def writer(i: int) -> None:
                gate.wait()
                while time.perf_counter() < stop:
                    with db.write() as c:
                        c.execute(update, {"now": time.time(), "id": ids[i]})
                        if notify:
                            db.notify_changed(c, [ids[i]])
                    counts[i] += 1

            ts = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
            t0 = time.perf_counter()
            for th in ts:
                th.start()
            for th in ts:
                th.join()
            return sum(counts) / (time.perf_counter() - t0)

        runs: dict[str, list[float]] = {"plain": [], "notify": []}
        window_of(True)  # warm-up
        for r in range(rounds):
            for kind in (("plain", "notify") if r % 2 else ("notify", "plain")):
                runs[kind].append(window_of(kind == "notify"))
    finally:
        db.dispose()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"threads": threads, "commits_per_s": med, "ratio": med["notify"] / med["plain"],
            "rounds": {k: [round(x) for x in v] for k, v in runs.items()}}


# ---- the run ----------------------------------------------------------------------------------
async def bench_replicas(cfg: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    from tests.postgres import bindir, pg_cluster

    if bindir() is None:
        raise BenchError("PostgreSQL's binaries (initdb, postgres) were not found")
    rng = random.Random(cfg.seed)
    out: dict[str, Any] = {"quick": cfg.quick, "clients": CLIENTS}
    with pg_cluster(durable=True) as cluster:
        with cluster.database() as url:
            console.log("1-2. calls over MCP: the no-op, SQLite, PostgreSQL with 1-3 replicas")
            noop = helper("noop", tmp, "noop").start()
            sqlite = cp_server("cp-sqlite", tmp, None)
            pg = [cp_server(f"cp-pg{i}", tmp, url) for i in range(1, 4)]
            try:
                urls = await started(noop, sqlite, *pg)
                out["latency"] = await latencies({"noop": urls[0], "sqlite": urls[1], "postgres": urls[2]},
                                                 cfg.calls, cfg.rounds, rng)
                out["throughput"] = await throughput(noop, sqlite, pg, cfg.window, cfg.rounds, rng)
            finally:
                for p in (noop, sqlite, *pg):
                    p.stop()
        with cluster.database() as url:
            console.log(f"3. the reconciler at {cfg.inflight:,} in flight")
            out["reconciler"] = await reconciler_cycles(tmp, url, cfg.inflight)
        with cluster.database() as url:
            console.log("4. progress across replicas")
            out["progress"] = await progress_across(tmp, url, cfg.progress_tasks, cfg.steps, cfg.interval)
        console.log("5. the fence per launch")
        out["fence"] = {}
        with cluster.database() as url:
            out["fence"]["postgres"] = await asyncio.to_thread(fence_cost, url, cfg.launches)
        out["fence"]["sqlite"] = await asyncio.to_thread(fence_cost, f"sqlite:///{tmp / 'fence.db'}", cfg.launches)
        with cluster.database() as url:
            console.log("6. NOTIFY and concurrent commits")
            out["notify"] = await asyncio.to_thread(notify_commits, url, CLIENTS, cfg.window, cfg.rounds + 1)
    return out


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title="PostgreSQL and replicas against SQLite (ratios within this run)", title_justify="left")
    for col in ("measure", "figure", "ratio", "baseline"):
        t.add_column(col, justify="left" if col in ("measure", "baseline") else "right")
    lat = r["latency"]
    for m in ("sqlite.submit", "postgres.submit", "sqlite.status", "postgres.status"):
        t.add_row(f"{m} p50", f"{lat[m]['p50_ms']:.2f} ms", f"{lat[m]['ratio_p50']:.2f}x",
                  f"no-op p50 {lat['noop']['p50_ms']:.2f} ms")
    th = r["throughput"]
    for k, v in th.items():
        if k != "noop":
            t.add_row(f"submits/s, {CLIENTS} clients, {k}", f"{v['calls_per_s']:.0f} (CPU {v['server_cpu'] * 100:.0f}%)",
                      f"{v['ratio']:.2f}x", f"no-op {th['noop']['calls_per_s']:.0f}/s")
    rc = r["reconciler"]
    for k in ("first", "steady"):
        t.add_row(f"reconciler cycle {k}, {r.get('inflight', INFLIGHT):,} in flight, PostgreSQL",
                  f"{rc['postgres'][k]['cpu_s']:.2f} s CPU, {rc['postgres'][k]['wall_s']:.2f} s",
                  f"{rc[f'{k}_cpu_ratio']:.2f}x CPU", f"SQLite {rc['sqlite'][k]['cpu_s']:.2f} s CPU")
    pr = r["progress"]
    t.add_row("progress across replicas p50 / p99", f"{pr['across_replicas']['p50_ms']:.1f} / "
              f"{pr['across_replicas']['p99_ms']:.1f} ms", f"{pr['ratio_p50']:.2f}x",
              f"same replica {pr['same_replica']['p50_ms']:.1f} / {pr['same_replica']['p99_ms']:.1f} ms")
    for eng, f in r["fence"].items():
        t.add_row(f"fence per launch ({eng})", f"+{f['added_ms']:.2f} ms", f"{f['ratio']:.2f}x",
                  f"unfenced claim+record {f['launch_db_ms']:.2f} ms")
    n = r["notify"]
    t.add_row(f"commits/s, {n['threads']} writers, with NOTIFY (PostgreSQL)", f"{n['commits_per_s']['notify']:.0f}",
              f"{n['ratio']:.2f}x", f"without {n['commits_per_s']['plain']:.0f}")
    console.print(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter windows, fewer calls and rounds")
    ap.add_argument("--seed", type=int, default=7)
    cfg = ap.parse_args()
    q = cfg.quick
    cfg.calls, cfg.rounds, cfg.window = (30, 2, 1.0) if q else (100, 3, 2.0)
    cfg.inflight = INFLIGHT
    cfg.progress_tasks, cfg.steps, cfg.interval = (1, 10, 0.2) if q else (2, 20, 0.2)
    cfg.launches = 100 if q else 300

    def measure(tmp: Path, console: Console) -> dict[str, Any]:
        return {"inflight": cfg.inflight, **asyncio.run(bench_replicas(cfg, tmp, console))}

    return standalone("replicas", measure, render)


if __name__ == "__main__":
    sys.exit(main())
