"""One reconciler cycle over 10,000 in-flight AWS Batch tasks: `python bench/aws_batch.py [--jobs N]`.

moto's server runs in a child process holding N RUNNING Batch jobs (created in its backend, so
the setup takes seconds rather than N SubmitJob calls). This process holds a control plane
whose database has N running tasks, each with the handle of one of those jobs, and runs
reconciler cycles against the real AWS Batch provider: DescribeJobs in chunks of 100 over
HTTP. The cycle must make at most ceil(N / 100) DescribeJobs calls. It reports the calls, the
wall time and this process's CPU time per cycle (moto's own CPU is in the other process), with
the provider's default rate limit (40 requests/s: 10k jobs then take at least 2.5 s of polling)
and without it (1000/s), so the limiter's share of the wall time shows.

Prints a table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MOTO_CHILD = r"""
import json, sys, threading
sys.path.insert(0, sys.argv[2])
from moto.server import ThreadedMotoServer
from moto.core.models import default_user_config
from tests import aws
n = int(sys.argv[1])
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
url = f"http://{host}:{port}"
aws.reset_moto(url)
aws.keep_submitted()
aws.create_batch(url)
backend = aws.backend()
from moto.batch_simple.models import batch_simple_backends
simple = batch_simple_backends[aws.ACCOUNT][aws.REGION]
ids = []
for i in range(n):
    _, job_id, _ = simple.submit_job(f"cp-bench-{i}-a1", aws.JOB_DEFINITION, aws.QUEUE, array_properties={})
    backend._jobs[job_id].status = "RUNNING"
    ids.append(job_id)
print(json.dumps({"url": url, "ids": ids}), flush=True)
threading.Event().wait()
"""


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=2)
    args = ap.parse_args()
    console = Console(stderr=True)
    t0 = time.monotonic()
    moto = subprocess.Popen([sys.executable, "-c", MOTO_CHILD, str(args.jobs), str(ROOT)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    results: dict[str, list[dict]] = {}
    try:
        assert moto.stdout is not None
        seeded = json.loads(moto.stdout.readline())
        console.log(f"moto holds {len(seeded['ids'])} RUNNING Batch jobs ({time.monotonic() - t0:.1f} s)")
        from tests import aws

        os.environ.update(aws.aws_env(seeded["url"]))
        for label, tps in (("limited (40/s)", 40.0), ("unlimited", 1000.0)):
            results[label] = run_cycles(seeded["ids"], tps, args.cycles, console)
    finally:
        moto.terminate()
        moto.wait(10)

    allowed = math.ceil(args.jobs / 100)
    table = Table(title=f"one reconciler cycle over {args.jobs} in-flight AWS Batch tasks (moto)")
    for col in ("rate limit", "cycle", "DescribeJobs calls", "allowed", "wall", "control plane CPU"):
        table.add_column(col, justify="right")
    for label, cycles in results.items():
        for c in cycles:
            table.add_row(label, str(c["cycle"]), str(c["describe_calls"]), str(allowed), f"{c['wall_s']:.2f} s",
                          f"{c['cpu_s']:.2f} s")
    Console().print(table)
    ok = all(c["describe_calls"] <= allowed and c["jobs"] == args.jobs for cs in results.values() for c in cs)
    print(json.dumps({"benchmark": "aws-batch-reconcile", "jobs": args.jobs, "allowed_describe_calls": allowed,
                      "results": results, "pass": ok}))
    return 0


def run_cycles(job_ids: list[str], tps: float, n: int, console) -> list[dict]:
    from bench.seed import seed_inflight
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane_providers import ratelimit
    from controlplane_providers.aws_batch import AwsBatchProvider
    from controlplane_providers.local import LocalProvider
    from tests import aws

    ratelimit._registry.clear()
    with tempfile.TemporaryDirectory(prefix="cp-bench-batch-") as home:
        aws.batch_catalog(Path(home))
        provider = AwsBatchProvider.configured(home, region=aws.REGION, max_tps=tps, poll_interval_s=1e-9)
        calls = {"describe": 0}
        provider.batch.meta.events.register("before-call.batch.DescribeJobs",
                                            lambda **_: calls.__setitem__("describe", calls["describe"] + 1))
        settings = Settings(home=home)
        local = LocalProvider.configured(home)
        cp = ControlPlane(settings, providers={"aws_batch": provider, "local": local})
        handles = [{"job_id": j, "job_name": f"cp-bench-{i}-a1", "job_queue": aws.QUEUE,
                    "log_group": aws.LOG_GROUP, "stuck_after_s": 900.0, "on_stuck": "wait"}
                   for i, j in enumerate(job_ids)]
        seed_inflight(cp.db, len(job_ids), provider="aws_batch", rc="batch", handles=handles)
        out = []
        for i in range(n):
            calls["describe"] = 0
            cpu0, t0 = time.process_time(), time.perf_counter()
            stats = cp.reconciler.cycle_sync(force_poll=True)
            out.append({"cycle": i + 1, "jobs": stats.jobs, "describe_calls": calls["describe"],
                        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
                        "finished": stats.finished, "lost": stats.lost})
            console.log(f"rate {tps:g}/s cycle {i + 1}: {out[-1]}")
        return out


if __name__ == "__main__":
    sys.exit(main())
