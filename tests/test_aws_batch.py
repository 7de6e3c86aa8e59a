"""The AWS Batch provider against moto's server: the whole lifecycle through the MCP tools (with
the real runner executing each job, logs in CloudWatch, results and artifacts in S3), the
mapping of every Batch status, failures with their reasons and exit codes, vanished and stuck
jobs, a crash between the launch intent and the job id, and a throttling proxy."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane_providers.aws_batch import AwsBatchOptions, AwsBatchProvider, BatchHandle
from controlplane_providers.base import JobPhase, LaunchSpec, PermanentProviderError
from tests import aws
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import moto_server, run_without_callback, usage_of  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent, most_in_one_second
from tests.exactly_once import a_late_launch_runs_nothing, a_recorded_execution_refused_its_claim_is_left_for_the_holder
from tests.provider_contract import Harness, ProviderContract
from tests.proxy import Proxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def bucket(moto: str) -> str:
    name = f"cp-{secrets.token_hex(5)}"
    aws.client("s3", moto).create_bucket(Bucket=name)
    return f"s3://{name}/runs"


@dataclass
class Batch:
    cp: ControlPlane
    agent: Agent
    executor: aws.BatchExecutor
    moto: str


@pytest.fixture
async def batch(moto: str, bucket: str, home: Path) -> AsyncIterator[Batch]:
    aws.batch_catalog(home, retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    with aws.BatchExecutor(moto) as executor:
        async with Client(build_server(cp)) as client:
            yield Batch(cp, Agent(client), executor, moto)


def batch_job(task_id: str, attempt: int = 1, *, final: bool = True) -> dict[str, Any]:
    """The Batch job of a task attempt, once it has ended (the task can end first: the runner
    reports before its process exits)."""
    name = f"cp-{task_id.removeprefix('tsk_')}-a{attempt}"
    deadline = time.monotonic() + 30
    while True:
        [job] = [j for j in aws.backend()._jobs.values() if j.job_name == name]
        if not final or job.job_stopped or time.monotonic() > deadline:
            return job.describe()
        time.sleep(0.02)


# ---- the lifecycle ----------------------------------------------------------------------------
async def test_lifecycle_through_the_mcp_tools(batch: Batch) -> None:
    agent = batch.agent
    tid = await agent.submit(inputs={"progress_steps": 3, "sleep_s": 0.6, "log_lines": 30, "artifact_bytes": 70_000,
                                     "result": {"on": "batch"}}, tags=["aws"])
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded", st
    assert st["progress"]["percent"] == 100
    assert st["log_link"].startswith("https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1#logsV2")

    job = batch_job(tid)
    assert job["jobName"] == f"cp-{tid.removeprefix('tsk_')}-a1" and job["status"] == "SUCCEEDED"
    assert job["tags"]["controlplane:task"] == tid and job["tags"]["controlplane:tool"] == "exercise"
    assert job["timeout"]["attemptDurationSeconds"] >= 300  # the tool's default runtime, plus grace
    env = {e["name"]: e["value"] for e in job["container"]["environment"]}
    assert env["CONTROLPLANE_TASK_ID"] == tid and env["CONTROLPLANE_STORE_URL"].startswith("s3://")
    # DescribeJobs shows only the bootstrap token, which the runner has traded (and so killed).
    from controlplane.launch import runner_secret

    assert "CONTROLPLANE_CALLBACK_SECRET" not in env
    assert runner_secret(batch.cp.secret_key, AttemptRef(tid, 1)) not in env.values()
    assert batch.cp.store.jobs.get(AttemptRef(tid, 1)).secret_claim is not None
    assert job["container"]["command"] == ["python", "-m", "controlplane_tools.exercise"]

    relayed = await agent.all_logs(tid)
    assert [ln["message"] for ln in relayed] == [f"line {i}" for i in range(30)]
    # The job's own log in CloudWatch, page by page on its forward token.
    seen = await agent.provider_log_messages(tid, limit=7)
    assert [m for m in seen if m.startswith("line ")] == [f"line {i}" for i in range(30)]

    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"]["on"] == "batch"
    [art] = res["artifacts"]
    body = httpx.get(art["download_url"]).content  # a presigned S3 GET on moto
    assert len(body) == art["size_bytes"] == 70_000 and hashlib.sha256(body).hexdigest() == art["sha256"]


async def test_cancel_reaches_the_batch_job(batch: Batch) -> None:
    agent = batch.agent
    tid = await agent.submit(inputs={"sleep_s": 120, "spawn_children": 1})
    await agent.wait(tid, {"running"}, timeout=60)
    proc = batch.executor.procs[batch_job(tid, final=False)["jobId"]]
    ack = await agent.call("cancel_task", task_id=tid, reason="not needed")
    assert ack["state"] == "cancel_requested"
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "cancelled" and st["error"]["code"] == "CANCELLED"
    job = batch_job(tid)
    assert job["status"] == "FAILED" and job["statusReason"] == "controlplane: cancel"
    assert proc.poll() is not None and not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
    path = [e.to_state for e in batch.cp.store.logs.events(tid) if e.to_state]
    assert path[-3:] == ["cancel_requested", "cancelling", "cancelled"]


async def test_failed_job_carries_exit_code_and_reason(batch: Batch) -> None:
    tid = await batch.agent.submit(inputs={"exit_code": 3, "log_lines": 2})
    st = await batch.agent.wait(tid, timeout=60)
    assert st["state"] == "failed" and st["error"]["code"] == "TOOL_FAILED" and st["error"]["exit_code"] == 3
    job = batch_job(tid)
    assert job["status"] == "FAILED" and job["container"].get("exitCode", job["attempts"][-1]["container"].get("exitCode")) == 3


async def test_job_that_never_starts_fails_as_launch_failed(moto: str, bucket: str, home: Path) -> None:
    """The image cannot be pulled: Batch fails the job before any runner exists."""
    aws.batch_catalog(home)
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    with aws.BatchExecutor(moto, start_jobs=False) as executor:
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={})
            await agent.wait(tid, {"scheduled"}, timeout=30)
            deadline = time.monotonic() + 30

            def ours() -> Any:
                return next((j for j in aws.backend()._jobs.values()
                             if j.job_name.endswith(tid.removeprefix("tsk_") + "-a1")), None)

            # once the executor has made it RUNNABLE (else its first look would undo the failure)
            while (job := ours()) is None or job.job_id not in executor.seen or job.status != "RUNNABLE":
                assert time.monotonic() < deadline
                await anyio.sleep(0.05)
            job.job_stopped_reason = "CannotPullContainerError: pull access denied for controlplane-runner"
            job._mark_stopped(success=False)
            st = await agent.wait(tid, timeout=30)
    assert st["state"] == "failed" and st["error"]["code"] == "LAUNCH_FAILED"
    assert "CannotPullContainerError" in st["error"]["message"]


async def test_usage_of_an_attempt_batch_ended_is_batchs_own_record_of_the_run(moto: str, bucket: str,
                                                                              home: Path) -> None:
    """A runner that cannot reach the control plane (a dead callback URL) leaves its events in the
    object store; the attempt ends when Batch reports the job stopped, and what it used is
    counted from Batch's startedAt and stoppedAt (DescribeJobs), times the class's shape."""
    aws.batch_catalog(home)  # (its class: 2 vCPUs, 2048 MiB)
    with aws.BatchExecutor(moto):
        st = await run_without_callback(home, bucket, {"sleep_s": 1.0})
    job = batch_job(st["task_id"])
    ran_s = (job["stoppedAt"] - job["startedAt"]) / 1000
    assert ran_s >= 1.0 and st["usage"] == usage_of(ran_s, 2, 2)
    # At Fargate's list price in us-east-1 (the client's region), the default table's.
    assert st["estimated_cost"]["amount"] == pytest.approx(ran_s * (2 * 0.04048 + 2 * 0.004445) / 3600, abs=2e-6)


# ---- every Batch status -----------------------------------------------------------------------
def spec(job_name: str, **options: Any) -> LaunchSpec:
    options.setdefault("job_definition", aws.JOB_DEFINITION)
    return LaunchSpec(task_id="tsk_" + job_name, attempt=1, job_name=job_name, tool_name="exercise", owner="me",
                      command=("python", "-m", "controlplane_tools.exercise"), image=None, env={"A": "1"}, cpu=1,
                      memory_mb=512, gpu=0, scratch_mb=0, max_runtime_s=60, resource_class="batch",
                      options=AwsBatchOptions(job_queue=aws.QUEUE, **options))


def test_every_batch_status_maps_onto_a_phase(moto: str, tmp_path: Path) -> None:
    provider = AwsBatchProvider.configured(tmp_path, region="us-east-1", poll_interval_s=0.1, stuck_after_s=3600)
    handle = provider.launch(spec("cp-map-a1"))
    job = aws.backend()._jobs[handle.job_id]
    expected = {"SUBMITTED": JobPhase.PENDING, "PENDING": JobPhase.PENDING, "RUNNABLE": JobPhase.PENDING,
                "STARTING": JobPhase.PENDING, "RUNNING": JobPhase.RUNNING}
    for status, phase in expected.items():
        job.status = status
        [st] = provider.poll([handle])
        assert (st.phase, st.raw_status, st.waiting_reason) == (phase, status, None), status
    job.job_started_at = job.job_created_at
    job._start_attempt()
    job.job_stopped_reason = "Essential container in task exited"
    # moto reports the exit code only in the attempt (the real API also in `container`)
    job.latest_attempt["container"]["exitCode"] = 137
    job._mark_stopped(success=False)
    [st] = provider.poll([handle])
    assert (st.phase, st.reason, st.exit_code) == (JobPhase.FAILED, "Essential container in task exited", 137)

    ok = provider.launch(spec("cp-map2-a1"))
    aws.backend()._jobs[ok.job_id]._mark_stopped(success=True)
    [st] = provider.poll([ok])
    assert st.phase == JobPhase.SUCCEEDED

    aws.backend()._jobs.pop(handle.job_id)  # Batch forgot it
    gone, still = provider.poll([handle, ok])
    assert gone.phase == JobPhase.GONE and still.phase == JobPhase.SUCCEEDED


def test_a_job_stuck_in_runnable_is_reported_and_given_up_on_by_policy(moto: str, tmp_path: Path) -> None:
    provider = AwsBatchProvider.configured(tmp_path, region="us-east-1", stuck_after_s=3600)
    patient = provider.launch(spec("cp-wait-a1", stuck_after_s=60))
    strict = provider.launch(spec("cp-fail-a1", stuck_after_s=60, on_stuck="fail"))
    for h in (patient, strict):
        job = aws.backend()._jobs[h.job_id]
        job.status = "RUNNABLE"
        job.job_created_at = job.job_created_at.replace(year=job.job_created_at.year - 1)  # waiting for ages
    wait, fail = provider.poll([patient, strict])
    assert wait.phase == JobPhase.PENDING and wait.give_up_reason is None
    assert wait.waiting_reason.startswith("RUNNABLE for ") and "compute capacity" in wait.waiting_reason
    assert fail.give_up_reason and "compute capacity" in fail.give_up_reason


async def test_stuck_job_shows_why_and_fails_when_the_catalog_says_so(moto: str, bucket: str, home: Path) -> None:
    aws.batch_catalog(home, provider_options='stuck_after_s = 1, on_stuck = "fail"')
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    with aws.BatchExecutor(moto, start_jobs=False):  # no capacity: nothing ever starts
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={})
            st = await agent.wait(tid, timeout=30)
    assert st["state"] == "failed" and st["error"]["code"] == "LAUNCH_FAILED"
    assert "RUNNABLE" in st["error"]["message"] and "compute capacity" in st["error"]["message"]
    job = batch_job(tid)
    assert job["status"] == "FAILED" and job["statusReason"] == "controlplane: gave up waiting"


async def test_waiting_reason_shows_in_status(moto: str, bucket: str, home: Path) -> None:
    aws.batch_catalog(home, provider_options="stuck_after_s = 1")
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    with aws.BatchExecutor(moto, start_jobs=False):
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={})
            deadline = time.monotonic() + 30
            while "waiting_reason" not in (st := await agent.call("get_task_status", task_id=tid)):
                assert time.monotonic() < deadline, st
                await anyio.sleep(0.1)
            assert st["state"] == "scheduled" and "RUNNABLE" in st["waiting_reason"]
            await agent.call("cancel_task", task_id=tid)
            assert (await agent.wait(tid, timeout=30))["state"] == "cancelled"


async def test_vanished_job_is_worker_lost_and_retried(batch: Batch) -> None:
    tid = await batch.agent.submit(inputs={"sleep_s": 2})
    await batch.agent.wait(tid, {"running"}, timeout=60)
    job_id = batch_job(tid, final=False)["jobId"]
    proc = batch.executor.procs[job_id]
    aws.backend()._jobs.pop(job_id)  # Batch no longer knows the job (purged, or another account)
    proc.kill()
    st = await batch.agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded" and st["attempt"] == 2
    retry = [e for e in batch.cp.store.logs.events(tid) if e.kind == "retry"]
    assert retry[0].detail["error"] == "WORKER_LOST"


# ---- handles stored by earlier versions -----------------------------------------------------------
# jobs.handle_json exactly as the code before typed handles wrote it.
OLD_BATCH_HANDLE = ('{"job_id": "5d1e1c7a-2f0e-4f6b-9a51-0c1f4b8e2d11", "job_name": "cp-01jf3kq8-a1", '
                    '"job_queue": "cp-queue", "log_group": "/aws/batch/job", "stuck_after_s": 900.0, "on_stuck": "wait"}')


def test_a_handle_stored_by_an_earlier_version_decodes_and_still_works(moto: str, tmp_path: Path) -> None:
    provider = AwsBatchProvider.configured(tmp_path, region="us-east-1")
    stored = provider.handle(json.loads(OLD_BATCH_HANDLE))
    assert isinstance(stored, BatchHandle) and json.dumps(stored.encode()) == OLD_BATCH_HANDLE
    launched = provider.launch(spec("cp-old-a1"))
    old = {"job_id": launched.job_id, "job_name": "cp-old-a1", "job_queue": aws.QUEUE, "log_group": aws.LOG_GROUP,
           "stuck_after_s": 900.0, "on_stuck": "wait"}  # what the earlier launch returned for this job
    restarted = AwsBatchProvider.configured(tmp_path, region="us-east-1")  # a new server, no memory of the job
    handle = restarted.handle(json.loads(json.dumps(old)))
    assert handle == launched
    [st] = restarted.poll([handle])
    assert (st.phase, st.raw_status) == (JobPhase.PENDING, "SUBMITTED")
    restarted.cancel(handle, "from an old row")
    assert aws.backend()._jobs[handle.job_id].job_stopped_reason == "controlplane: from an old row"


# ---- scratch disk: the job definition's ---------------------------------------------------------------
async def test_scratch_disk_within_the_fargate_job_definitions_storage_runs_on_it(moto: str, bucket: str,
                                                                                    home: Path) -> None:
    arn = aws.register_fargate_definition(moto, "cp-runner-fargate", storage_gib=50)
    aws.batch_catalog(home, job_definition="cp-runner-fargate")
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    with aws.BatchExecutor(moto):
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            err = await agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 60_000})
            assert err["code"] == "INVALID_REQUEST"
            assert err["message"].startswith(
                "resources.scratch_mb=60000 exceeds the 51200 MiB of scratch disk the aws_batch provider guarantees "
                "for resource class 'batch': job definition cp-runner-fargate:1 runs on Fargate with 50 GiB"), err
            assert (await agent.call("list_tasks"))["tasks"] == [] and aws.backend()._jobs == {}

            tid = await agent.submit(inputs={"log_lines": 2}, resources={"scratch_mb": 40_000})
            assert (await agent.wait(tid, timeout=60))["state"] == "succeeded"
    job = batch_job(tid)
    assert job["jobDefinition"] == arn  # the job ran on the definition whose storage covers the ask
    [definition] = aws.client("batch", moto).describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
    assert definition["containerProperties"]["ephemeralStorage"]["sizeInGiB"] * 1024 >= 40_000


async def test_scratch_disk_on_an_ec2_job_definition_is_refused(moto: str, bucket: str, home: Path) -> None:
    aws.batch_catalog(home)  # the runner's job definition has no platformCapabilities: EC2
    cp = ControlPlane(Settings(home=home, object_store_url=bucket, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        err = await agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 1024})
        assert err["code"] == "INVALID_REQUEST"
        assert err["message"] == (
            "resources.scratch_mb: the aws_batch provider cannot reserve scratch disk for this task: job definition "
            f"{aws.JOB_DEFINITION}:1 runs on EC2 resources, where AWS Batch reserves no disk for a job (jobs share the "
            "instance's storage; only a Fargate job definition's ephemeralStorage is reserved)")
        assert (await agent.call("list_tasks"))["tasks"] == []
    assert aws.backend()._jobs == {}


def test_a_fargate_definition_without_ephemeral_storage_gives_fargates_default(moto: str, tmp_path: Path) -> None:
    aws.register_fargate_definition(moto, "cp-runner-small")
    provider = AwsBatchProvider.configured(tmp_path, region="us-east-1")
    shape = spec("cp-x-a1", job_definition="cp-runner-small").shape
    assert provider.scratch_limit_mb(shape) == 20 * 1024
    assert "20 GiB (20480 MiB) of ephemeral storage (Fargate's default" in provider.scratch_note(shape)


def test_launch_refuses_scratch_its_job_definition_no_longer_gives(moto: str, tmp_path: Path) -> None:
    """Between submit and launch the job definition got a new revision with less storage: the
    launch fails (LAUNCH_FAILED) rather than run the task without the disk it asked for."""
    aws.register_fargate_definition(moto, "cp-runner-shrunk", storage_gib=100)
    provider = AwsBatchProvider.configured(tmp_path, region="us-east-1")
    asked = replace(spec("cp-shrunk-a1", job_definition="cp-runner-shrunk"), scratch_mb=90_000)
    assert provider.scratch_limit_mb(asked.shape) == 100 * 1024
    aws.register_fargate_definition(moto, "cp-runner-shrunk", storage_gib=30)  # revision 2, now the active one
    provider._storage.clear()  # (its facts are otherwise trusted for a minute)
    with pytest.raises(PermanentProviderError, match="scratch_mb=90000; job definition cp-runner-shrunk:2 runs on "
                                                     "Fargate with 30 GiB"):
        provider.launch(asked)
    assert aws.backend()._jobs == {}  # nothing submitted
    ok = provider.launch(replace(asked, scratch_mb=30 * 1024))
    assert aws.backend()._jobs[ok.job_id].job_definition.revision == 2


# ---- crash between the launch intent and the job id -------------------------------------------
async def test_crash_after_submit_before_the_handle_launches_exactly_one_job(moto: str, bucket: str,
                                                                          home: Path) -> None:
    aws.batch_catalog(home)
    settings = Settings(home=home, object_store_url=bucket, **FAST)
    first = ControlPlane(settings)
    from controlplane import api

    tid = first.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"log_lines": 3}))["task_id"]
    [claimed] = first.store.jobs.claim_for_launch("batch", 4)  # the launch intent, committed
    task, job = claimed
    first.scheduler._write_inputs(task)
    first.providers["aws_batch"].launch(first.build_spec(task, job))  # SubmitJob went through...
    del first  # ...and the control plane died before recording the job id

    second = ControlPlane(settings)  # the restart
    assert second.store.jobs.get(AttemptRef(tid, 1)).state == "launching"
    with aws.BatchExecutor(moto):
        async with Client(build_server(second)) as client:
            st = await Agent(client).wait(tid, timeout=60)
    named = [j for j in aws.backend()._jobs.values() if j.job_name == job.job_name]
    assert len(named) == 1  # found by name, not submitted again
    assert st["state"] == "succeeded"
    assert json.loads(second.store.jobs.get(AttemptRef(tid, 1)).handle_json)["job_id"] == named[0].job_id


# ---- throttling ---------------------------------------------------------------------------------
class FaultProxy(Proxy):
    """An HTTP proxy in front of moto that answers 429 or 500 to a share of Batch requests and
    records when every request arrived. With `lose_submits`, that share of SubmitJob requests
    reaches moto (the job is made) and is then answered 500: the answer was lost."""

    def __init__(self, target: str, fault_rate: float, seed: int = 1, lose_submits: float = 0.0):
        self.fault_rate = fault_rate
        self.lose_submits = lose_submits
        self.lost = 0
        self.rng = random.Random(seed)
        self.faults = 0
        super().__init__(target)

    def answer(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            fault = self.rng.random() < self.fault_rate
            if fault:
                self.faults += 1
                code, kind = self.rng.choice([(429, "TooManyRequestsException"), (500, "ServerException")])
            lose = (self.lose_submits > 0 and not fault and path.lower().endswith("/submitjob")
                    and self.rng.random() < self.lose_submits)
            self.lost += lose
        if lose:
            self.forward(method, path, headers, body)
            fault, code, kind = True, 500, "ServerException"
        if fault:
            payload = json.dumps({"__type": kind, "message": "injected"}).encode()
            return code, [("x-amzn-ErrorType", kind), ("content-type", "application/json")], payload
        return self.forward(method, path, headers, body)

    def max_per_second(self) -> int:
        return most_in_one_second([t for t, _method, _path in self.requests])


async def test_throttled_batch_api_fails_no_task_and_stays_under_the_rate(moto: str, bucket: str, home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = FaultProxy(moto, fault_rate=0.3)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)  # only Batch goes through the proxy
    aws.batch_catalog(home)
    rate = 3  # low enough that launches, polls and retries together would exceed it unchecked
    monkeypatch.setenv("CONTROLPLANE_AWS_BATCH_MAX_TPS", str(rate))
    monkeypatch.setenv("CONTROLPLANE_AWS_BATCH_POLL_INTERVAL_S", "0.05")
    settings = Settings(home=home, object_store_url=bucket, **FAST)
    import controlplane_providers.ratelimit as ratelimit

    ratelimit._registry.clear()  # a fresh limiter for this endpoint
    try:
        cp = ControlPlane(settings)
        with aws.BatchExecutor(moto):
            async with Client(build_server(cp)) as client:
                agent = Agent(client)
                tids = [await agent.submit(inputs={"sleep_s": 0.5, "log_lines": 3}) for _ in range(8)]
                cancel_me = await agent.submit(inputs={"sleep_s": 60})
                await agent.wait(cancel_me, {"running"}, timeout=120)
                await agent.call("cancel_task", task_id=cancel_me)
                states = [(await agent.wait(t, timeout=180))["state"] for t in tids]
                assert (await agent.wait(cancel_me, timeout=180))["state"] == "cancelled"
        assert states == ["succeeded"] * 8
        assert proxy.faults > 5
        assert proxy.max_per_second() <= rate, proxy.max_per_second()
        names = [j.job_name for j in aws.backend()._jobs.values()]
        assert len(names) == len(set(names)) == 9  # no job submitted twice despite failed calls
    finally:
        proxy.close()


# ---- the provider contract suite ----------------------------------------------------------------
class BatchHarness(Harness):
    """AWS Batch on moto, with the executor playing the compute environment and a fault proxy in
    front of the Batch API."""

    def __init__(self, home: Path, moto: str, executor: aws.BatchExecutor, proxy: FaultProxy):
        self.executor = executor
        self.capacity, self.faults = executor, proxy  # start_jobs, fault_rate
        self.provider = AwsBatchProvider.configured(home, region=aws.REGION, endpoint_url=proxy.url, max_tps=500,
                                                    poll_interval_s=0.1)
        self.options = AwsBatchOptions(job_queue=aws.QUEUE, job_definition=aws.JOB_DEFINITION)
        self.log_quota_setting = "log_reads_per_min"

    def count_jobs(self, job_name: str) -> int:
        return sum(1 for j in aws.backend()._jobs.values() if j.job_name == job_name)

    def forget(self, handle: BatchHandle) -> None:
        aws.backend()._jobs.pop(handle.job_id, None)
        proc = self.executor.procs.get(handle.job_id)
        if proc is not None and proc.poll() is None:
            proc.kill()


class TestBatchContract(ProviderContract):
    @pytest.fixture
    def harness(self, moto: str, tmp_path: Path) -> Iterator[BatchHarness]:
        proxy = FaultProxy(moto, fault_rate=0.0)
        try:
            with aws.BatchExecutor(moto) as executor:
                yield BatchHarness(tmp_path, moto, executor, proxy)
        finally:
            proxy.close()


async def test_a_submit_whose_answer_was_lost_is_found_not_submitted_again(moto: str, bucket: str, home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the SubmitJob calls make their job and then answer 500. Retried as they were sent
    (botocore's retries), each such call would make a second job of the same name; the control
    plane instead finds the job it made, and runs each task's job once."""
    proxy = FaultProxy(moto, fault_rate=0.0, lose_submits=0.5)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
    aws.batch_catalog(home)
    monkeypatch.setenv("CONTROLPLANE_AWS_BATCH_POLL_INTERVAL_S", "0.05")
    settings = Settings(home=home, object_store_url=bucket, **FAST)
    import controlplane_providers.ratelimit as ratelimit

    ratelimit._registry.clear()
    try:
        cp = ControlPlane(settings)
        with aws.BatchExecutor(moto):
            async with Client(build_server(cp)) as client:
                agent = Agent(client)
                tids = [await agent.submit(inputs={"sleep_s": 0.2}) for _ in range(6)]
                states = [(await agent.wait(t, timeout=180))["state"] for t in tids]
        assert states == ["succeeded"] * 6
        assert proxy.lost >= 2
        names = [j.job_name for j in aws.backend()._jobs.values()]
        assert sorted(names) == sorted({cp.store.jobs.get(AttemptRef(t, 1)).job_name for t in tids}), names  # one job each
    finally:
        proxy.close()


async def test_a_late_second_launch_of_an_attempt_runs_nothing(batch: Batch) -> None:
    """A leader paused past its lease submits the Batch job its successor already submitted: the
    second job's runner is refused the attempt's claim and exits 75 without running the tool."""
    await a_late_launch_runs_nothing(batch.cp, batch.agent)


async def test_a_recorded_execution_refused_its_claim_leaves_the_attempt_to_the_holder(batch: Batch) -> None:
    """The late launch claimed first: the job follows the execution that holds the claim."""
    await a_recorded_execution_refused_its_claim_is_left_for_the_holder(batch.cp, batch.agent)
