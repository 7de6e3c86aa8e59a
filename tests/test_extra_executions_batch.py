"""An extra execution of a running attempt on AWS Batch (moto, the real runner): a second Batch
job of the attempt, submitted by hand as the first was (a cloud's retry, a paused leader's late
launch), has its claim refused and is stopped by the reconciler, while the first runs on to its
result. The second job's container outlives its runner here (a sidecar, or a runner image that
goes on after the refusal): only the reconciler's stop ends it. Both engines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.ops import metrics
from controlplane.settings import Settings
from tests import aws
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import moto_server  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent
from tests.exactly_once import claimed_by_its_runner

pytestmark = pytest.mark.anyio


class OutlivingExecutor(aws.BatchExecutor):
    """Batch as `aws.BatchExecutor` plays it, except that a job of a name in `extra_of` other than
    that name's first job keeps RUNNING after its runner exits, until TerminateJob."""

    def __init__(self, moto_url: str):
        super().__init__(moto_url)
        self.extra_of: dict[str, str] = {}  # job name -> the id of its first job

    def _step(self, job: Any) -> None:
        first = self.extra_of.get(job.job_name)
        proc = self.procs.get(job.job_id)
        if (first not in (None, job.job_id) and proc is not None and proc.poll() is not None
                and not job.stop and not job.job_stopped):
            return  # the container outlives its runner
        super()._step(job)


@pytest.fixture
async def plane(moto: str, home: Path) -> AsyncIterator[tuple[ControlPlane, Agent, OutlivingExecutor]]:
    bucket = f"cp-extra-{time.monotonic_ns() % 10**9}"
    aws.client("s3", moto).create_bucket(Bucket=bucket)
    aws.batch_catalog(home)
    cp = ControlPlane(Settings(home=home, object_store_url=f"s3://{bucket}/runs", **FAST))
    with OutlivingExecutor(moto) as executor:
        async with Client(build_server(cp)) as client:
            yield cp, Agent(client), executor


def stopped_on_batch() -> float:
    return metrics.REGISTRY.get_sample_value("controlplane_extra_executions_total",
                                             {"provider": "aws_batch", "action": "stopped"}) or 0.0


async def test_a_second_batch_job_of_an_attempt_is_stopped_and_the_first_delivers(
        plane: tuple[ControlPlane, Agent, OutlivingExecutor], moto: str) -> None:
    cp, agent, executor = plane
    before = stopped_on_batch()
    tid = await agent.submit(inputs={"sleep_s": 6, "log_lines": 3, "result": {"once": True}})
    await claimed_by_its_runner(cp, tid)
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    assert job is not None and job.handle_json
    first_id = json.loads(job.handle_json)["job_id"]

    # The second job, as Batch would have it: the first's definition, queue, name and environment.
    batch = aws.client("batch", moto)
    [first] = batch.describe_jobs(jobs=[first_id])["jobs"]
    executor.extra_of[first["jobName"]] = first_id
    second_id = batch.submit_job(jobName=first["jobName"], jobQueue=first["jobQueue"],
                                 jobDefinition=first["jobDefinition"],
                                 containerOverrides={"command": first["container"]["command"],
                                                     "environment": first["container"]["environment"]})["jobId"]

    # Its runner asks for the attempt's claim and is refused: the claim route counts it on the job.
    # (Where the route does not count it, the test records the refusal the runner got.)
    for _ in range(300):
        if cp.store.jobs.get(AttemptRef(tid, 1)).extra_claims:
            break
        await anyio.sleep(0.1)
    else:
        cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))

    for _ in range(300):  # the reconciler stops it: Batch ends it FAILED
        [second] = batch.describe_jobs(jobs=[second_id])["jobs"]
        if second["status"] in ("SUCCEEDED", "FAILED"):
            break
        await anyio.sleep(0.1)
    assert second["status"] == "FAILED", second
    assert second.get("statusReason", "").startswith("controlplane: an extra execution"), second
    assert executor.runs[first["jobName"]] == 2

    st = await agent.wait(tid, timeout=90)
    assert st["state"] == "succeeded" and st["attempt"] == 1, st
    assert (await agent.call("get_task_result", task_id=tid))["result"]["once"] is True
    assert [ln["message"] for ln in await agent.all_logs(tid)] == ["line 0", "line 1", "line 2"]
    [first] = batch.describe_jobs(jobs=[first_id])["jobs"]
    assert first["status"] in ("RUNNING", "SUCCEEDED"), first  # never stopped by the reconciler
    assert stopped_on_batch() == before + 1

    shown = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "jobs", "--json", "--home", str(cp.settings.home)],
        capture_output=True, text=True, timeout=60))
    assert shown.returncode == 0, shown.stderr
    [row] = [r for r in json.loads(shown.stdout) if r["task_id"] == tid]
    assert row["extra_stopped"] == 1 and row["extra_claims"] >= 1 and row["extra_checked"] == row["extra_claims"], row
