"""Reconciler cycles over 5,000 in-flight Cloud Run executions across 5 jobs, beside AWS Batch:
`python bench/cloud_run.py [--executions N] [--jobs J] [--no-batch]`.

The fake Cloud Run Admin API (`tests/gcp.py`) runs in a child process holding N running
executions spread over J jobs (synthetic: no process behind them), so its CPU is not this
process's. This process holds a control plane whose database has N running tasks, each with the
handle of one execution, and runs reconciler cycles against the real Cloud Run provider over
REST. Cloud Run has no batch get: the provider lists each job's executions, so a cycle must cost
one ListExecutions per job per page (ceil(N / J / page_size) pages a job) and nothing per
execution. It reports the Admin API requests per cycle (counted by the fake), the wall time and
this process's CPU per cycle, at two page sizes; then the same figures for AWS Batch over N jobs
on moto (`bench/aws_batch.py`: ceil(N / 100) DescribeJobs), measured in the same run.

Prints a table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A fake cloud (argv[4]: cloud_run or container_apps) holding n running executions over `jobs`
# jobs, and a second port that answers its request counts since the last ask.
FAKE_CHILD = r"""
import json, sys, threading
sys.path.insert(0, sys.argv[3])
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from tests import azure, gcp
n, jobs, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
fake = gcp.FakeCloudRun() if kind == "cloud_run" else azure.FakeAzure(page_size=int(sys.argv[5]))
names = {}
for j in range(jobs):
    job, count = f"cp-bench-{j}", n // jobs + (1 if j < n % jobs else 0)
    if kind == "cloud_run":
        names[job] = fake.add_executions(gcp.PROJECT, gcp.REGION, job, count)
    else:
        names[job] = fake.add_executions(azure.RESOURCE_GROUP, job, count, status="Running")

class Counts(BaseHTTPRequestHandler):  # GET /: requests by method and path kind since the last GET
    def do_GET(self):
        with fake._lock:
            reqs, fake.requests[:] = list(fake.requests), []
        kinds = {}
        for _, method, path in reqs:
            kind = "list" if path.endswith("/executions") else ("get" if "/executions/" in path else path)
            kinds[f"{method} {kind}"] = kinds.get(f"{method} {kind}", 0) + 1
        body = json.dumps(kinds).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass

counts = ThreadingHTTPServer(("127.0.0.1", 0), Counts)
threading.Thread(target=counts.serve_forever, daemon=True).start()
print(json.dumps({"url": fake.url, "counts": f"http://127.0.0.1:{counts.server_address[1]}", "names": names,
                  "ca_file": str(getattr(fake, "ca_file", ""))}), flush=True)
threading.Event().wait()
"""


def main() -> int:
    from rich.console import Console

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executions", type=int, default=5_000)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--no-batch", action="store_true", help="skip the AWS Batch comparison")
    args = ap.parse_args()
    console = Console(stderr=True)
    t0 = time.monotonic()
    results: dict[str, list[dict]] = {}
    with fake_cloud("cloud_run", args.executions, args.jobs) as seeded:
        console.log(f"the fake holds {args.executions} running executions in {args.jobs} jobs "
                    f"({time.monotonic() - t0:.1f} s)")
        for page_size in (500, 1000):
            results[f"cloud_run page {page_size}"] = run_cycles(seeded, page_size, args.cycles, console)
    per_job = math.ceil(args.executions / args.jobs)
    if not args.no_batch:
        results["aws_batch"] = batch_cycles(args.executions, args.cycles, console)

    ok = report(f"one reconciler cycle over {args.executions} in-flight executions", results, args.executions)
    print(json.dumps({"benchmark": "cloud-run-reconcile", "executions": args.executions, "jobs": args.jobs,
                      "executions_per_job": per_job, "results": results, "pass": ok}))
    return 0


def report(title: str, results: dict[str, list[dict]], executions: int) -> bool:
    """Print one row a cycle (CPU also as a ratio to AWS Batch's best cycle, when measured);
    True if every cycle kept to its API target and watched every execution."""
    from rich.console import Console
    from rich.table import Table

    batch_cpu = min((c["cpu_s"] for c in results.get("aws_batch", [])), default=None)
    table = Table(title=title)
    for col in ("provider", "cycle", "API calls", "target", "wall", "control plane CPU", "CPU vs Batch"):
        table.add_column(col, justify="right")
    for label, cycles in results.items():
        for c in cycles:
            c["cpu_vs_batch"] = c["cpu_s"] / batch_cpu if batch_cpu else None
            table.add_row(label, str(c["cycle"]), str(c["api_calls"]), str(c["target"]), f"{c['wall_s']:.2f} s",
                          f"{c['cpu_s']:.2f} s", f"{c['cpu_vs_batch']:.1f}x" if c["cpu_vs_batch"] else "")
    Console(width=max(120, Console().width)).print(table)
    return all(c["api_calls"] <= c["target"] and c["jobs"] == executions for cs in results.values() for c in cs)


@contextlib.contextmanager
def fake_cloud(kind: str, executions: int, jobs: int, page_size: int = 100) -> Iterator[dict]:
    """The fake of `kind` in a child process, seeded; yields its url, count url and names."""
    child = subprocess.Popen([sys.executable, "-c", FAKE_CHILD, str(executions), str(jobs), str(ROOT), kind,
                              str(page_size)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert child.stdout is not None
        yield json.loads(child.stdout.readline())
    finally:
        child.terminate()
        child.wait(10)


def measure(cp, seeded: dict, label: str, target: int, n: int, console) -> list[dict]:
    """`n` forced reconciler cycles: API requests (counted by the fake), wall and CPU time each."""
    out = []
    for i in range(n):
        counts(seeded)
        cpu0, t0 = time.process_time(), time.perf_counter()
        stats = cp.reconciler.cycle_sync(force_poll=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        kinds = counts(seeded)
        out.append({"cycle": i + 1, "jobs": stats.jobs, "api_calls": sum(kinds.values()), "by_kind": kinds,
                    "target": target, "wall_s": wall, "cpu_s": cpu, "finished": stats.finished, "lost": stats.lost})
        console.log(f"{label} cycle {i + 1}: {out[-1]}")
    return out


def run_cycles(seeded: dict, page_size: int, n: int, console) -> list[dict]:
    from bench.seed import seed_inflight
    from controlplane.app import ControlPlane
    from controlplane.settings import Settings
    from controlplane_providers import ratelimit
    from controlplane_providers.cloud_run import CloudRunProvider
    from controlplane_providers.local import LocalProvider
    from tests import gcp

    ratelimit._registry.clear()
    with tempfile.TemporaryDirectory(prefix="cp-bench-cloudrun-") as home:
        gcp.cloud_run_catalog(Path(home))
        provider = CloudRunProvider.configured(home, endpoint=seeded["url"], logging_endpoint=seeded["url"],
                                               anonymous=True, page_size=page_size, poll_interval_s=1e-9,
                                               max_tps=1000)
        cp = ControlPlane(Settings(home=home), providers={"cloud_run": provider, "local": LocalProvider.configured(home)})
        handles = []
        for job, names in seeded["names"].items():
            path = f"projects/{gcp.PROJECT}/locations/{gcp.REGION}/jobs/{job}"
            handles += [{"execution": name, "job": path, "job_name": f"synthetic-{i}", "created_at": time.time(),
                         "log_uri": None, "stuck_after_s": 900.0, "on_stuck": "wait"} for i, name in enumerate(names)]
        seed_inflight(cp.db, len(handles), provider="cloud_run", rc="cloudrun", handles=handles)
        target = sum(math.ceil(len(names) / page_size) for names in seeded["names"].values())
        return measure(cp, seeded, f"cloud run page {page_size}", target, n, console)


def counts(seeded: dict) -> dict[str, int]:
    with urllib.request.urlopen(seeded["counts"]) as r:
        return json.loads(r.read())


def batch_cycles(n_jobs: int, cycles: int, console) -> list[dict]:
    """bench/aws_batch.py's measurement over the same number of jobs, without its rate limit."""
    from bench import aws_batch
    from tests import aws

    moto = subprocess.Popen([sys.executable, "-c", aws_batch.MOTO_CHILD, str(n_jobs), str(ROOT)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert moto.stdout is not None
        seeded = json.loads(moto.stdout.readline())
        os.environ.update(aws.aws_env(seeded["url"]))
        runs = aws_batch.run_cycles(seeded["ids"], 1000.0, cycles, console)
    finally:
        moto.terminate()
        moto.wait(10)
    return [{**r, "api_calls": r["describe_calls"], "target": math.ceil(n_jobs / 100)} for r in runs]


if __name__ == "__main__":
    sys.exit(main())
