"""Sweeps: `python bench/sweeps.py [--quick] [--shards 10000] [--rounds 3]`.

On SQLite (the home's file) and on a throwaway PostgreSQL cluster with its durable defaults
(`tests/postgres.py`), through the task service (`TaskService.submit_sweep`, what the MCP tool
calls, without the transport):

* the time of one `submit_sweep` of N shards (every shard checked against the tool's schema,
  the guards counting all of them, N task rows and their events written in one transaction),
  p50 over rounds, against one `submit_task` measured in the same run (its p50 over 20 submits):
  the ratio says what a shard costs next to a task submitted alone (N submits would cost N);
* `get_sweep_status` of an N-shard sweep, p50 and p99 over 50 calls (aggregates: no shard is
  loaded but the running ones), against its counts by state alone (the GROUP BY, p50);
* the transaction that ends a `fail_fast: 1` sweep's first failure with N shards queued (it
  cancels one batch, `CONTROLPLANE_RELEASE_BATCH`), and the longest of the reconciler's
  follow-ups that cancel the rest;
* memory per queued shard: the RSS of a process that opens the control plane on a home holding an
  N-shard sweep and runs its scheduler, reconciler and a status a few times, over the same on a
  home holding a 1-shard sweep, per shard (the issue's bound: 2 KB, as per queued task);
* launches per second of a sweep on a provider double whose launch holds a place in the shared
  rate limiter (`SlidingWindowLimiter`, `--rate` a second, 20 ms a call), against that limit:
  the steady rate (the launches after the first window's `--rate`, over the time from the first
  start to the last) and the most in any one-second window, each as a ratio of the limit;
* an idle reconciler cycle with `--stops` (1,000) stopped sweeps on file whose stops are done
  (each cancelled whole): its statements and p50 time, against the same cycles reading what stops
  left with the look kept before `stop_done_at` (an EXISTS over a sweep's shards per stopped
  sweep, put back for the measure), and the look alone each way (`--part stops` runs only this).

The control plane runs no loops for the first three (nothing is launched); the catalog's queue
has room for every round. Targets: the submit under 2 s on SQLite and 4 s on PostgreSQL at
10,000 shards, the status under 20 ms p99, 2 KB per queued shard, launches at the limit and never
over it. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/sweeps.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from bench.harness import BenchError, percentile  # noqa: E402


def catalog(home: Path, queue_length: int, concurrency: int = 2) -> None:
    from controlplane.catalog import default_catalog_text

    text = default_catalog_text()
    old = "[resource_classes.cpu_small]\nmax_concurrency = 2\nmax_queue_length = 1000"
    if old not in text:
        raise BenchError("the default catalog's cpu_small queue changed: update the benchmark")
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(text.replace(old, f"[resource_classes.cpu_small]\nmax_concurrency = {concurrency}\n"
                                                         f"max_queue_length = {queue_length}"))


def submit_sweep(svc: Any, shards: int, **kw: Any) -> str:
    from controlplane import api

    vary = {"list": [{"sleep_s": 0.001 * i, "progress_steps": i % 7} for i in range(shards)]}
    req = api.SubmitSweep.model_validate({"tool_name": "exercise", "base_inputs": {"log_lines": 1}, "vary": vary,
                                          "tags": ["bench"], **kw})
    return str(svc.submit_sweep("bench", req)["sweep_id"])


def measure(home: Path, url: str | None, shards: int, rounds: int) -> dict[str, Any]:
    from controlplane import api
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings

    catalog(home, queue_length=(rounds + 1) * shards + 100)
    cp = ControlPlane(Settings(home=home, database_url=url))
    svc = cp.service
    try:
        single: list[float] = []
        for i in range(20):
            req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0.001 * i})
            t = time.perf_counter()
            svc.submit("bench", req)
            single.append(time.perf_counter() - t)
        times: list[float] = []
        sweep_id = ""
        for _ in range(rounds):
            t = time.perf_counter()
            sweep_id = submit_sweep(svc, shards)
            times.append(time.perf_counter() - t)
        status: list[float] = []
        req_status = api.GetSweepStatus(sweep_id=sweep_id)
        for _ in range(50):
            t = time.perf_counter()
            st = svc.sweep_status("bench", req_status)
            status.append(time.perf_counter() - t)
        counts: list[float] = []  # its GROUP BY alone, for what the rest of the status costs
        for _ in range(50):
            t = time.perf_counter()
            cp.store.sweeps.state_counts(sweep_id)
            counts.append(time.perf_counter() - t)
        if st["shards"] != shards or st["counts"] != {"queued": shards}:
            raise BenchError(f"the sweep's status is not what was submitted: {st['counts']}")
        stop = fail_fast_stop(cp, shards)
    finally:
        cp.store.db.dispose()
    one = percentile(single, 50)
    p50 = percentile(times, 50)
    return {"submit_task_p50_s": one, "submit_sweep_p50_s": p50, "submit_sweep_max_s": max(times),
            "sweep_over_one_submit": p50 / one, "per_shard_over_one_submit": p50 / shards / one,
            "status_p50_ms": percentile(status, 50) * 1000, "status_p99_ms": percentile(status, 99) * 1000,
            "counts_p50_ms": percentile(counts, 50) * 1000,
            "status_over_counts": percentile(status, 50) / percentile(counts, 50), **stop}


def fail_fast_stop(cp: Any, shards: int) -> dict[str, Any]:
    """The transaction that ends the first failure of a `fail_fast: 1` sweep of `shards` queued
    shards (its launch refused), and the longest follow-up that cancels what it left."""
    sweep_id = submit_sweep(cp.service, shards, fail_fast=1, priority=100)  # claimed before the others
    claimed = cp.store.jobs.claim_for_launch("cpu_small", 1)
    if [task.sweep_id for task, _ in claimed] != [sweep_id]:
        raise BenchError("the fail_fast sweep's first shard was not the one claimed")
    t = time.perf_counter()
    cp.scheduler.attempts.end_unlaunched(claimed[0][1].ref, "refused by the benchmark")
    stop_s = time.perf_counter() - t
    longest = 0.0
    while True:
        t = time.perf_counter()
        if cp.store.sweeps.stop_left() is None:
            break
        longest = max(longest, time.perf_counter() - t)
    counts = {s.value: n for s, n in cp.store.sweeps.state_counts(sweep_id).items()}
    if counts.get("queued") or counts.get("cancelled", 0) + counts.get("failed", 0) != shards:
        raise BenchError(f"the fail_fast stop left shards behind: {counts}")
    return {"fail_fast_stop_s": stop_s, "fail_fast_follow_up_max_s": longest}


MEMORY_PROBE = """
import anyio, gc, json, sys
from pathlib import Path
import psutil
from bench.doubles import CountingProvider
from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
home, url, sweep_id = Path(sys.argv[1]), sys.argv[2] or None, sys.argv[3]
cp = ControlPlane(Settings(home=home, database_url=url), providers={"local": CountingProvider()})
for _ in range(3):
    anyio.run(cp.scheduler.tick)
    cp.reconciler.cycle_sync()
    cp.service.sweep_status("bench", api.GetSweepStatus(sweep_id=sweep_id))
gc.collect()
print(json.dumps({"rss": psutil.Process().memory_info().rss}))
cp.store.db.dispose()
"""


def memory_per_shard(home: Path, url: str | None, shards: int) -> dict[str, Any]:
    """RSS of a control plane whose database holds an N-shard sweep over one holding a 1-shard
    sweep, per shard (each in a process of its own, after its loops ran three times)."""
    import subprocess

    from controlplane.app import ControlPlane
    from controlplane.settings import Settings

    rss: dict[int, int] = {}
    for n in (1, shards):
        at = home / f"memory-{n}"
        catalog(at, queue_length=n + 100)
        cp = ControlPlane(Settings(home=at, database_url=url))
        try:
            sweep_id = submit_sweep(cp.service, n)
        finally:
            cp.store.db.dispose()
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(at), url or "", sweep_id], cwd=ROOT,
                             capture_output=True, text=True, timeout=600, check=False)
        if out.returncode != 0:
            raise BenchError(f"the memory probe failed: {out.stderr[-2000:]}")
        rss[n] = int(json.loads(out.stdout.strip().splitlines()[-1])["rss"])
    return {"rss_1_shard_mb": rss[1] / 2**20, f"rss_{shards}_shards_mb": rss[shards] / 2**20,
            # (SQLite: a home, so a database, each; PostgreSQL: one database, holding both sweeps)
            "per_queued_shard_kb": (rss[shards] - rss[1]) / (shards - 1 if url is None else shards) / 1024}


def launch_rate(home: Path, url: str | None, shards: int, rate: int) -> dict[str, Any]:
    """A sweep of `shards` launched by the scheduler on a provider double whose launch holds a
    place in a `rate`-a-second limiter for 20 ms: launches per second against the limit."""
    import anyio

    from bench.doubles import CountingHandle, CountingProvider
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane_providers.ratelimit import SlidingWindowLimiter

    class Limited(CountingProvider):
        def __init__(self) -> None:
            super().__init__()
            self.limiter = SlidingWindowLimiter(rate)
            self.starts: list[float] = []

        def launch(self, spec: Any) -> CountingHandle:
            token = self.limiter.acquire()
            try:
                self.starts.append(time.monotonic())
                time.sleep(0.02)  # the API call
                return super().launch(spec)
            finally:
                self.limiter.release(token)

    catalog(home, queue_length=shards + 100, concurrency=shards)
    provider = Limited()
    cp = ControlPlane(Settings(home=home, database_url=url), providers={"local": provider})
    try:
        submit_sweep(cp.service, shards)
        deadline = time.monotonic() + 10 * shards / rate + 30
        while len(provider.starts) < shards and time.monotonic() < deadline:
            anyio.run(cp.scheduler.tick)
    finally:
        cp.store.db.dispose()
    starts = sorted(provider.starts)
    if len(starts) != shards:
        raise BenchError(f"{len(starts)} of {shards} shards launched")
    span = starts[-1] - starts[0]
    most = max(sum(1 for t in starts[i:] if t < s + 1.0) for i, s in enumerate(starts))
    # The limiter lets the first `rate` start at once (an empty window): the steady rate is of the
    # launches after them, over the time from the first start to the last.
    per_s = (shards - rate) / span if span > 0 else float("inf")
    return {"rate_limit_per_s": rate, "launches_per_s": per_s, "launches_over_limit": per_s / rate,
            "most_in_a_second": most, "most_in_a_second_over_limit": most / rate}


def finished_stops(home: Path, url: str | None, stops: int, cycles: int = 30) -> dict[str, Any]:
    """Idle reconciler cycles with `stops` stopped sweeps whose stops are done, reading what stops
    left as now and as before `stop_done_at` (the old look, an EXISTS per stopped sweep): the
    statements and p50 time of a cycle, and of the look alone, each way."""
    from sqlalchemy import exists, or_, select

    from controlplane import api
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane.store import sweep_queries as sq

    old_look = (select(sq.SW.c.sweep_id, sq.SW.c.stop_reason)
                .where(sq.SW.c.stopped_at.is_not(None),
                       exists().where(sq.T.c.sweep_id == sq.SW.c.sweep_id, or_(*(sq.T.c.state == s for s in sq.STOPPABLE))))
                .order_by(sq.SW.c.stopped_at).limit(1))
    catalog(home, queue_length=2 * stops + 100)
    cp = ControlPlane(Settings(home=home, database_url=url))
    statements = [0]

    def counted(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            statements[0] += 1
            return method(*a, **kw)
        return call

    for name in ("fetch", "run", "rows", "count", "run_many"):  # every prebuilt statement the store runs
        setattr(cp.db, name, counted(getattr(cp.db, name)))
    try:
        for _ in range(stops):
            sweep_id = submit_sweep(cp.service, 2)
            cp.service.cancel_sweep("bench", api.CancelSweep(sweep_id=sweep_id))
        if cp.store.sweeps.stop_left() is not None:
            raise BenchError("a cancelled sweep's stop was not marked done")
        out: dict[str, Any] = {"stops": stops}
        new_look = sq.NEXT_STOP_LEFT
        for name, look in (("old", old_look), ("new", new_look)):
            sq.NEXT_STOP_LEFT = look  # what `SweepStore.stop_left` reads
            try:
                times, counts, reads = [], [], []
                for _ in range(cycles):
                    before, t = statements[0], time.perf_counter()
                    cp.reconciler.cycle_sync()
                    times.append(time.perf_counter() - t)
                    counts.append(statements[0] - before)
                    t = time.perf_counter()
                    if cp.store.sweeps.stop_left() is not None:
                        raise BenchError("an idle cycle found a stop left")
                    reads.append(time.perf_counter() - t)
            finally:
                sq.NEXT_STOP_LEFT = new_look
            out[f"{name}_cycle_ms"] = percentile(times, 50) * 1000
            out[f"{name}_cycle_statements"] = percentile([float(n) for n in counts], 50)
            out[f"{name}_look_ms"] = percentile(reads, 50) * 1000
    finally:
        cp.store.db.dispose()
    out["cycle_new_over_old"] = out["new_cycle_ms"] / out["old_cycle_ms"]
    out["look_new_over_old"] = out["new_look_ms"] / out["old_look_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 shards, 2 rounds")
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=20, help="the launch rate limit a second")
    parser.add_argument("--stops", type=int, default=1_000, help="stopped sweeps on file for the idle cycle")
    parser.add_argument("--part", choices=("all", "stops"), default="all", help="stops: the idle cycle alone")
    args = parser.parse_args()
    shards, rounds = (2_000, 2) if args.quick else (args.shards, args.rounds)
    launched = 5 * args.rate if args.quick else 20 * args.rate
    from tests.postgres import bindir, pg_cluster

    out: dict[str, Any] = {"shards": shards, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as tmp:
        def each(eng: str, fresh: Callable[[], AbstractContextManager[str | None]]) -> dict[str, Any]:
            """Every figure of one engine, each part on a database of its own (`fresh`)."""
            at = Path(tmp) / eng
            with fresh() as url:
                r = finished_stops(at / "stops", url, args.stops)
            if args.part == "stops":
                return r
            with fresh() as url:
                r.update(measure(at, url, shards, rounds))
            with fresh() as url:
                r.update(memory_per_shard(at, url, shards))
            with fresh() as url:
                r.update(launch_rate(at / "launches", url, launched, args.rate))
            return r

        out["sqlite"] = each("sqlite", lambda: nullcontext(None))  # (each part's home has its own file)
        if bindir() is None:
            print("PostgreSQL's binaries (initdb, postgres) were not found: SQLite only", file=sys.stderr)
        else:
            with pg_cluster(durable=True) as cluster:
                out["postgres"] = each("postgres", cluster.database)
    for eng in ("sqlite", "postgres"):
        r = out.get(eng)
        if r is not None:
            print(f"{eng:9} idle reconciler cycle with {r['stops']} finished stops on file: "
                  f"{r['new_cycle_ms']:.2f} ms, {r['new_cycle_statements']:.0f} statements (before stop_done_at: "
                  f"{r['old_cycle_ms']:.2f} ms, {r['old_cycle_statements']:.0f}) = {r['cycle_new_over_old']:.3f}x; "
                  f"the look for what stops left {r['new_look_ms']:.3f} ms against {r['old_look_ms']:.3f} ms "
                  f"= {r['look_new_over_old']:.3f}x")
        if r is not None and args.part == "all":
            print(f"{eng:9} submit_sweep({shards}) p50 {r['submit_sweep_p50_s']:.3f} s "
                  f"(= {r['sweep_over_one_submit']:.0f}x one submit_task of {r['submit_task_p50_s'] * 1000:.2f} ms; "
                  f"a shard {r['per_shard_over_one_submit']:.3f}x a task submitted alone); "
                  f"get_sweep_status p50 {r['status_p50_ms']:.2f} ms, p99 {r['status_p99_ms']:.2f} ms "
                  f"({r['status_over_counts']:.1f}x its GROUP BY's p50 of {r['counts_p50_ms']:.2f} ms)")
            print(f"{eng:9} fail_fast stop at {shards} queued: {r['fail_fast_stop_s']:.3f} s, longest follow-up "
                  f"{r['fail_fast_follow_up_max_s']:.3f} s; {r['per_queued_shard_kb']:.2f} KB per queued shard "
                  f"(bound 2 KB); {launched} launches at {r['launches_per_s']:.1f}/s = "
                  f"{r['launches_over_limit']:.2f}x the limit of {args.rate}/s, at most {r['most_in_a_second']} "
                  f"in a second ({r['most_in_a_second_over_limit']:.2f}x)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
