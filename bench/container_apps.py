"""Reconciler cycles over 5,000 in-flight Azure Container Apps executions across 5 jobs, beside
Cloud Run and AWS Batch: `python bench/container_apps.py [--executions N] [--jobs J] [--quick]`.

The fake ARM server (`tests/azure.py`, HTTPS) runs in a child process holding N running
executions spread over J jobs (synthetic: no process behind them), so its CPU is not this
process's. This process holds a control plane whose database has N running tasks, each with the
handle of one execution, and runs reconciler cycles against the real Container Apps provider
(azure-mgmt-appcontainers). There is no batch get: the provider lists each job's executions,
so a cycle must cost one executions list per job per page (ceil(N / J / page) ARM reads, the
page being the service's: 100 on the fake, measured at 100 and 1000) and nothing per execution.
It reports the ARM reads per cycle (counted by the fake), the wall time and this process's CPU per
cycle; then the same figures for Cloud Run (page 500) over the same executions and AWS Batch over
N jobs on moto (ceil(N / 100) DescribeJobs), measured in the same run. The ARM read limiter is
lifted (1000/s) so that CPU, not the 20/s default, is what the wall time shows; at the default a
cycle of R reads takes at least R / 20 s.

Prints a table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cloud_run  # noqa: E402


def main() -> int:
    from rich.console import Console

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executions", type=int, default=5_000)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="500 executions, one cycle each")
    args = ap.parse_args()
    if args.quick:
        args.executions, args.cycles = 500, 1
    console = Console(stderr=True)
    results: dict[str, list[dict]] = {}
    for page in (100, 1000):
        with cloud_run.fake_cloud("container_apps", args.executions, args.jobs, page_size=page) as seeded:
            results[f"container_apps page {page}"] = run_cycles(seeded, page, args.cycles, console)
    with cloud_run.fake_cloud("cloud_run", args.executions, args.jobs) as seeded:
        results["cloud_run page 500"] = cloud_run.run_cycles(seeded, 500, args.cycles, console)
    results["aws_batch"] = cloud_run.batch_cycles(args.executions, args.cycles, console)

    ok = cloud_run.report(f"one reconciler cycle over {args.executions} in-flight executions in {args.jobs} jobs",
                          results, args.executions)
    print(json.dumps({"benchmark": "container-apps-reconcile", "executions": args.executions, "jobs": args.jobs,
                      "executions_per_job": math.ceil(args.executions / args.jobs), "results": results, "pass": ok}))
    return 0


def run_cycles(seeded: dict, page: int, n: int, console) -> list[dict]:
    from bench.seed import seed_inflight
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane_providers import ratelimit
    from controlplane_providers.container_apps import ContainerAppsOptions, ContainerAppsProvider
    from controlplane_providers.local import LocalProvider
    from tests import azure
    from tests.test_container_apps import catalog

    ratelimit._registry.clear()
    with tempfile.TemporaryDirectory(prefix="cp-bench-aca-") as home:
        catalog(Path(home))
        provider = ContainerAppsProvider.configured(
            home, subscription_id=azure.SUBSCRIPTION, endpoint=seeded["url"], logs_endpoint=seeded["url"],
            ca_bundle=seeded["ca_file"], anonymous=True, poll_interval_s=1e-9, max_reads_per_s=1000,
            max_writes_per_s=1000)
        cp = ControlPlane(Settings(home=home), providers={"container_apps": provider,
                                                          "local": LocalProvider.configured(home)})
        handles = []
        for job, names in seeded["names"].items():
            job_id = ContainerAppsOptions(resource_group=azure.RESOURCE_GROUP, job=job).job_id(azure.SUBSCRIPTION)
            handles += [{"execution": name, "job": job_id, "job_name": f"synthetic-{i}", "created_at": time.time(),
                         "workspace_id": azure.WORKSPACE, "stuck_after_s": 900.0, "on_stuck": "wait"}
                        for i, name in enumerate(names)]
        seed_inflight(cp.db, len(handles), provider="container_apps", rc="aca", handles=handles)
        target = sum(math.ceil(len(names) / page) for names in seeded["names"].values())
        return cloud_run.measure(cp, seeded, f"container apps page {page}", target, n, console)


if __name__ == "__main__":
    sys.exit(main())
