"""A folded list page: `python bench/folded_list.py [--quick] [--shards 10000] [--calls 30]`.

On SQLite (the home's file) and on a throwaway PostgreSQL cluster (`tests/postgres.py`), at the
store (`TaskStore.list`, what list_tasks reads, without the sweeps' own rows the service adds):
a page of 50 with `whole_sweeps` with 0, 1 and 10 sweeps of N queued shards on file, newer than
60 tasks of their own, p50 over `--calls`, without a filter, with `tool_name` and with
`states=[queued]`, each against a plain page of 50 (no fold: the newest shards) measured in the
same run, and against the walk that skips every other shard one probe at a time
(`queries.lowest_shard`, the fallback for the filters the merge cannot answer) on the same data;
and what the partial indexes of the tasks of no sweep cost a `submit_task` (p50 of 300, taking
turns with a database where they were dropped). The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/folded_list.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from bench.harness import BenchError, percentile  # noqa: E402
from bench.sweeps import catalog, submit_sweep  # noqa: E402

FILTERS: dict[str, dict[str, Any]] = {"none": {}, "tool": {"tool_name": "exercise"}, "queued": {"states_": ["queued"]}}


def p50_ms(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return percentile(times, 50) * 1000


def measure(home: Path, url: str | None, shards: int, calls: int) -> dict[str, Any]:
    from controlplane import api
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane.store import queries as q
    from controlplane.store.rows import TaskSummary

    catalog(home, queue_length=11 * shards + 1000)
    cp = ControlPlane(Settings(home=home, database_url=url))
    tasks = cp.store.tasks
    out: dict[str, Any] = {}
    try:
        for i in range(60):
            cp.service.submit("bench", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0.001 * i}))

        def walked(**kw: Any) -> list[Any]:  # the probe-per-shard walk, as before the merge
            with cp.store.db.read() as c:
                return [TaskSummary(*r) for stmt in q.list_page(
                    "bench", states_=kw.get("states_"), tool_name=kw.get("tool_name"), tags_any=None,
                    submitted_after=None, submitted_before=None, after=None, limit=51, whole_sweeps=True)
                    for r in c.execute(stmt).all()]

        on_file = 0
        for n in (0, 1, 10):
            while on_file < n:
                submit_sweep(cp.service, shards)
                on_file += 1
            for name, kw in FILTERS.items():
                folded = tasks.list("bench", limit=51, whole_sweeps=True, **kw)
                if len(folded) != min(51, 60 + n) or len([r for r in folded if r.sweep_id]) != n:
                    raise BenchError(f"the folded page with {n} sweeps ({name}) holds {len(folded)} rows")
                if [r.pk for r in folded] != [r.pk for r in walked(**kw)]:
                    raise BenchError(f"the merge and the walk disagree with {n} sweeps ({name})")
                plain = p50_ms(lambda kw=kw: tasks.list("bench", limit=51, **kw), calls)
                fold = p50_ms(lambda kw=kw: tasks.list("bench", limit=51, whole_sweeps=True, **kw), calls)
                walk = p50_ms(lambda kw=kw: walked(**kw), max(3, calls // 5))
                out[f"{n}:{name}"] = {"plain_ms": plain, "folded_ms": fold, "walk_ms": walk,
                                      "folded_over_plain": fold / plain, "walk_over_plain": walk / plain}
    finally:
        cp.store.db.dispose()
    return out


def submit_cost(tmp: Path, urls: tuple[str | None, str | None], n: int = 300) -> dict[str, Any]:
    """submit_task's p50 with the partial indexes and without them (dropped), taking turns."""
    from sqlalchemy import text

    from controlplane import api
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings

    cps = []
    for name, url in zip(("with", "without"), urls, strict=True):
        catalog(tmp / name, queue_length=10 * n)
        cps.append(ControlPlane(Settings(home=tmp / name, database_url=url)))
    with cps[1].store.db.engine.begin() as c:
        for ix in ("ix_tasks_owner_plain", "ix_tasks_owner_state_plain", "ix_tasks_owner_tool_plain"):
            c.execute(text(f"DROP INDEX {ix}"))
    times: list[list[float]] = [[], []]
    try:
        for i in range(n):
            for k, cp in enumerate(cps):
                t = time.perf_counter()
                cp.service.submit("bench", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0.001 * i}))
                times[k].append(time.perf_counter() - t)
    finally:
        for cp in cps:
            cp.store.db.dispose()
    with_, without = (percentile(t, 50) * 1000 for t in times)
    return {"submit_with_ms": with_, "submit_without_ms": without, "submit_with_over_without": with_ / without}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 shards a sweep, 10 calls")
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    shards, calls = (2_000, 10) if args.quick else (args.shards, args.calls)
    from tests.postgres import bindir, pg_cluster

    out: dict[str, Any] = {"shards": shards}
    with tempfile.TemporaryDirectory(prefix="bench-fold-") as tmp:
        with nullcontext(None) as url:
            out["sqlite"] = measure(Path(tmp) / "sqlite", url, shards, calls)
            out["sqlite"]["submit"] = submit_cost(Path(tmp) / "sqlite-submit", (None, None))
        if bindir() is None:
            print("PostgreSQL's binaries (initdb, postgres) were not found: SQLite only", file=sys.stderr)
        else:
            with pg_cluster(durable=True) as cluster:
                with cluster.database() as url:
                    out["postgres"] = measure(Path(tmp) / "postgres", url, shards, calls)
                with cluster.database() as with_, cluster.database() as without:
                    out["postgres"]["submit"] = submit_cost(Path(tmp) / "postgres-submit", (with_, without))
    for eng in ("sqlite", "postgres"):
        for key, r in out.get(eng, {}).items():
            if key == "submit":
                print(f"{eng:9} submit_task p50 with the partial indexes {r['submit_with_ms']:.3f} ms, without "
                      f"{r['submit_without_ms']:.3f} ms = {r['submit_with_over_without']:.3f}x")
                continue
            n, name = key.split(":")
            print(f"{eng:9} {n:>2} sweeps of {shards}, filter {name:6}: plain {r['plain_ms']:.2f} ms, folded "
                  f"{r['folded_ms']:.2f} ms = {r['folded_over_plain']:.2f}x, the shard-by-shard walk "
                  f"{r['walk_ms']:.2f} ms = {r['walk_over_plain']:.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
