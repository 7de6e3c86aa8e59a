"""Sweeps: `python bench/sweeps.py [--quick] [--shards 10000] [--rounds 3]`.

On SQLite (the home's file) and on a throwaway PostgreSQL cluster with its durable defaults
(`tests/postgres.py`), through the task service (`TaskService.submit_sweep`, what the MCP tool
calls, without the transport):

* the time of one `submit_sweep` of N shards (every shard checked against the tool's schema,
  the guards counting all of them, N task rows and their events written in one transaction),
  p50 over rounds, against one `submit_task` measured in the same run (its p50 over 20 submits):
  the ratio says what a shard costs next to a task submitted alone (N submits would cost N);
* `get_sweep_status` of an N-shard sweep, p50 and p99 over 50 calls (aggregates: no shard is
  loaded but the running ones).

The control plane runs no loops (nothing is launched); the catalog's queue has room for every
round. Targets: the submit under 2 s on SQLite and 4 s on PostgreSQL at 10,000
shards, the status under 20 ms p99. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/sweeps.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from bench.run import BenchError, percentile  # noqa: E402


def catalog(home: Path, queue_length: int) -> None:
    from controlplane.catalog import default_catalog_text

    text = default_catalog_text()
    old = "[resource_classes.cpu_small]\nmax_concurrency = 2\nmax_queue_length = 1000"
    if old not in text:
        raise BenchError("the default catalog's cpu_small queue changed: update the benchmark")
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(text.replace(old, "[resource_classes.cpu_small]\nmax_concurrency = 2\n"
                                                         f"max_queue_length = {queue_length}"))


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
        vary = {"list": [{"sleep_s": 0.001 * i, "progress_steps": i % 7} for i in range(shards)]}
        sweep = api.SubmitSweep.model_validate({"tool_name": "exercise", "base_inputs": {"log_lines": 1},
                                                "vary": vary, "tags": ["bench"]})
        times: list[float] = []
        sweep_id = ""
        for _ in range(rounds):
            t = time.perf_counter()
            sweep_id = svc.submit_sweep("bench", sweep)["sweep_id"]
            times.append(time.perf_counter() - t)
        status: list[float] = []
        req_status = api.GetSweepStatus(sweep_id=sweep_id)
        for _ in range(50):
            t = time.perf_counter()
            st = svc.sweep_status("bench", req_status)
            status.append(time.perf_counter() - t)
        if st["shards"] != shards or st["counts"] != {"queued": shards}:
            raise BenchError(f"the sweep's status is not what was submitted: {st['counts']}")
    finally:
        cp.store.db.dispose()
    one = percentile(single, 50)
    p50 = percentile(times, 50)
    return {"submit_task_p50_s": one, "submit_sweep_p50_s": p50, "submit_sweep_max_s": max(times),
            "sweep_over_one_submit": p50 / one, "per_shard_over_one_submit": p50 / shards / one,
            "status_p50_ms": percentile(status, 50) * 1000, "status_p99_ms": percentile(status, 99) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 shards, 2 rounds")
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shards, rounds = (2_000, 2) if args.quick else (args.shards, args.rounds)
    from tests.postgres import bindir, pg_cluster

    out: dict[str, Any] = {"shards": shards, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as tmp:
        out["sqlite"] = measure(Path(tmp) / "sqlite", None, shards, rounds)
        if bindir() is None:
            print("PostgreSQL's binaries (initdb, postgres) were not found: SQLite only", file=sys.stderr)
        else:
            with pg_cluster(durable=True) as cluster, cluster.database() as url:
                out["postgres"] = measure(Path(tmp) / "postgres", url, shards, rounds)
    for eng in ("sqlite", "postgres"):
        r = out.get(eng)
        if r is not None:
            print(f"{eng:9} submit_sweep({shards}) p50 {r['submit_sweep_p50_s']:.3f} s "
                  f"(= {r['sweep_over_one_submit']:.0f}x one submit_task of {r['submit_task_p50_s'] * 1000:.2f} ms; "
                  f"a shard {r['per_shard_over_one_submit']:.3f}x a task submitted alone); "
                  f"get_sweep_status p50 {r['status_p50_ms']:.2f} ms, p99 {r['status_p99_ms']:.2f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
