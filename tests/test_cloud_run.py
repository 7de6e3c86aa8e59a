"""The Cloud Run Jobs provider against the fake Admin API v2 and Cloud Logging (`tests/gcp.py`),
driven by the real google-cloud-run and google-cloud-logging clients over REST, with the fake
running each execution's runner as a local process and results and artifacts in GCS on its
emulator: the whole lifecycle through the MCP tools, the status table, a crash between intent and
execution name, a wrong job name, throttled APIs, the log quota, and the provider contract suite."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from controlplane_providers.base import JobPhase
from controlplane_providers.cloud_run import CloudRunHandle, CloudRunOptions, CloudRunProvider, execution_status
from tests import gcp
from tests.cloud import CloudTarget, gcs_server, gcs_target, run_without_callback, usage_of  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent
from tests.exactly_once import a_late_launch_runs_nothing, a_recorded_execution_refused_its_claim_is_left_for_the_holder
from tests.provider_contract import Harness, ProviderContract, still_watched

pytestmark = pytest.mark.anyio
PROJECT, REGION, JOB, RUNNER = gcp.PROJECT, gcp.REGION, gcp.JOB, gcp.RUNNER


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[gcp.FakeCloudRun]:
    with gcp.FakeCloudRun(seed=7) as fake:
        fake.create_job(PROJECT, REGION, JOB, command=RUNNER, args=["python", "-m", "controlplane_tools.exercise"])
        for k, v in {"ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.2",
                     "MAX_TPS": "500", "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "1"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        ratelimit._registry.clear()  # fresh limiters for this fake's endpoint
        yield fake


@pytest.fixture
def gcs(gcs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CloudTarget:  # noqa: F811
    target = gcs_target(gcs_server, tmp_path)
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)  # the runners (the fake's processes) inherit them, as a job its identity
    return target


@dataclass
class Run:
    cp: ControlPlane
    agent: Agent
    fake: gcp.FakeCloudRun


@pytest.fixture
async def run(fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> AsyncIterator[Run]:
    gcp.cloud_run_catalog(home, retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    async with Client(build_server(cp)) as client:
        yield Run(cp, Agent(client), fake)


def execution_of(fake: gcp.FakeCloudRun, tid: str, attempt: int = 1, *, final: bool = False) -> dict[str, Any]:
    """The execution of a task attempt; with `final`, once it has ended (the task can end first:
    the runner reports before its process exits)."""
    name = f"cp-{tid.removeprefix('tsk_')}-a{attempt}"
    deadline = time.monotonic() + 30
    while True:
        [ex] = [e for e in fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == name]
        if not final or ex["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            return ex
        time.sleep(0.05)


# ---- the lifecycle through the MCP tools ----------------------------------------------------------
async def test_lifecycle_through_the_mcp_tools(run: Run) -> None:
    agent = run.agent
    tid = await agent.submit(inputs={"progress_steps": 3, "sleep_s": 0.6, "log_lines": 30, "artifact_bytes": 50_000,
                                     "result": {"on": "cloud run"}})
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded", st
    assert st["progress"]["percent"] == 100
    ex = execution_of(run.fake, tid, final=True)
    assert ex["state"] == "succeeded" and ex["args"] == ["python", "-m", "controlplane_tools.exercise"]
    assert ex["env"]["CONTROLPLANE_TASK_ID"] == tid and ex["env"]["CONTROLPLANE_STORE_URL"].startswith("gs://")
    assert "CONTROLPLANE_CALLBACK_SECRET" not in ex["env"] and ex["timeout_s"] >= 300
    assert st["log_link"].startswith("https://") and ex["short"] in st["log_link"]  # the execution's log_uri

    relayed = await agent.all_logs(tid)
    assert [ln["message"] for ln in relayed] == [f"line {i}" for i in range(30)]
    # The execution's own log in Cloud Logging, page by page.
    seen = await agent.provider_log_messages(tid, limit=9)
    assert [m for m in seen if m.startswith("line ")] == [f"line {i}" for i in range(30)]

    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"]["on"] == "cloud run"
    [art] = res["artifacts"]
    body = httpx.get(art["download_url"]).content  # a V4 signed URL on the GCS emulator
    assert len(body) == art["size_bytes"] == 50_000 and hashlib.sha256(body).hexdigest() == art["sha256"]


async def test_cancel_reaches_the_execution(run: Run) -> None:
    tid = await run.agent.submit(inputs={"sleep_s": 120, "spawn_children": 1})
    await run.agent.wait(tid, {"running"}, timeout=60)
    proc = run.fake.processes[execution_of(run.fake, tid)["name"]]
    assert (await run.agent.call("cancel_task", task_id=tid, reason="enough"))["state"] == "cancel_requested"
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "cancelled" and st["error"]["code"] == "CANCELLED"
    assert execution_of(run.fake, tid, final=True)["state"] == "cancelled" and proc.poll() is not None


async def test_timeout_stops_the_execution(run: Run) -> None:
    tid = await run.agent.submit(inputs={"sleep_s": 120}, resources={"max_runtime_s": 1})
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "timed_out" and st["error"]["code"] == "TOOL_TIMEOUT"
    assert execution_of(run.fake, tid, final=True)["state"] == "cancelled"


async def test_failed_tool_and_vanished_execution(run: Run) -> None:
    bad = await run.agent.submit(inputs={"exit_code": 3})
    st = await run.agent.wait(bad, timeout=60)
    assert st["state"] == "failed" and st["error"]["code"] == "TOOL_FAILED" and st["error"]["exit_code"] == 3

    tid = await run.agent.submit(inputs={"sleep_s": 2})
    await run.agent.wait(tid, {"running"}, timeout=60)
    run.fake.forget(execution_of(run.fake, tid)["name"])  # pruned from the job's history, process killed
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded" and st["attempt"] == 2  # worker_lost, retried
    retry = [e for e in run.cp.store.logs.events(tid) if e.kind == "retry"]
    assert retry[0].detail["error"] == "WORKER_LOST"


async def test_usage_of_an_attempt_cloud_run_ended_is_the_executions_own_record(fake: gcp.FakeCloudRun,
                                                                                 gcs: CloudTarget, home: Path) -> None:
    """A runner that cannot reach the control plane leaves its events in the object store; the
    attempt ends when Cloud Run reports the execution completed, and what it used is counted
    from the execution's startTime and completionTime, times the class's shape (1 vCPU, 512 MiB)."""
    gcp.cloud_run_catalog(home)
    st = await run_without_callback(home, gcs.url, {"sleep_s": 1.0})
    ex = fake.execution_json(execution_of(fake, st["task_id"], final=True)["name"])
    ran_s = (datetime.fromisoformat(ex["completionTime"]) - datetime.fromisoformat(ex["startTime"])).total_seconds()
    assert ran_s >= 1.0 and st["usage"] == usage_of(ran_s, 1, 0.5)
    # Cloud Run's Tier 1 list prices (the execution's region), per second.
    assert st["estimated_cost"]["amount"] == pytest.approx(ran_s * (0.000018 + 0.000002 / 2), abs=2e-6)


async def test_a_wrong_job_name_fails_the_launch_clearly(fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    gcp.cloud_run_catalog(home, job="no-such-job")
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        st = await agent.wait(await agent.submit(inputs={}), timeout=30)
    assert st["state"] == "failed" and st["error"]["code"] == "LAUNCH_FAILED"
    assert f"projects/{PROJECT}/locations/{REGION}/jobs/no-such-job does not exist" in st["error"]["message"]


async def test_a_catalog_entry_without_a_job_is_refused_at_load(home: Path) -> None:
    from controlplane.catalog import Catalog, CatalogError

    gcp.cloud_run_catalog(home)
    text = (home / "catalog.toml").read_text().replace(f'job = "{JOB}"', 'jb = "x"')
    with pytest.raises(CatalogError) as err:
        Catalog.parse(text, source="catalog.toml")
    assert str(err.value).startswith("catalog.toml: tools.exercise.provider_options.")
    text = (home / "catalog.toml").read_text().replace(f'project = "{PROJECT}", ', "")
    with pytest.raises(CatalogError, match="project and region are required"):
        Catalog.parse(text, source="catalog.toml")


# ---- scratch disk: refused, nothing created ----------------------------------------------------------
async def test_scratch_disk_is_refused_and_nothing_runs(run: Run) -> None:
    err = await run.agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 512})
    assert err["code"] == "INVALID_REQUEST"
    assert err["message"] == (
        "resources.scratch_mb: the cloud_run provider cannot reserve scratch disk for this task: a Cloud Run "
        "execution cannot be given disk: RunJob overrides carry only args, env, the task count and the timeout, and "
        "the container's own filesystem is in memory (it counts against the job's memory)")
    assert (await run.agent.call("list_tasks"))["tasks"] == [] and run.fake.executions() == []


# ---- handles stored by earlier versions ------------------------------------------------------------
# jobs.handle_json exactly as the code before typed handles wrote it (log_uri null until Cloud Run
# has given the execution one).
OLD_CLOUD_RUN_HANDLES = [
    '{"execution": "projects/cp-test/locations/us-central1/jobs/cp-exercise/executions/cp-exercise-x7k2p", '
    '"job": "projects/cp-test/locations/us-central1/jobs/cp-exercise", "job_name": "cp-01jf3kq8-a1", '
    '"created_at": 1764201345.27, "log_uri": null, "stuck_after_s": 900.0, "on_stuck": "wait"}',
    '{"execution": "projects/cp-test/locations/us-central1/jobs/cp-exercise/executions/cp-exercise-x7k2q", '
    '"job": "projects/cp-test/locations/us-central1/jobs/cp-exercise", "job_name": "cp-01jf3kq8-a2", '
    '"created_at": 1764201345.27, "log_uri": "https://console.cloud.google.com/logs/viewer?x=1", '
    '"stuck_after_s": 60.0, "on_stuck": "fail"}',
]


@pytest.mark.parametrize("stored", OLD_CLOUD_RUN_HANDLES)
def test_handles_stored_by_earlier_versions_decode_unchanged(stored: str, tmp_path: Path) -> None:
    provider = CloudRunProvider.configured(tmp_path, anonymous=True)
    handle = provider.handle(json.loads(stored))
    assert isinstance(handle, CloudRunHandle) and provider.poll_key(handle).endswith("/jobs/cp-exercise")
    assert json.dumps(handle.encode()) == stored


def test_an_execution_launched_by_an_earlier_version_is_still_watched(fake: gcp.FakeCloudRun, tmp_path: Path) -> None:
    def earlier(launched: CloudRunHandle) -> dict[str, Any]:  # what the earlier launch returned for it
        return {"execution": launched.execution, "job": launched.job, "job_name": "cp-old-a1",
                "created_at": launched.created_at, "log_uri": launched.log_uri, "stuck_after_s": 900.0,
                "on_stuck": "wait"}

    restarted = CloudRunProvider.configured(tmp_path, poll_interval_s=0.1)
    handle, _ = still_watched(CloudRunHarness(tmp_path, fake), restarted, earlier)
    assert restarted.log_link(handle)
    assert execution_of_name(fake, handle.execution, final=True)["state"] == "cancelled"


def execution_of_name(fake: gcp.FakeCloudRun, name: str, *, final: bool) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        [ex] = [e for e in fake.executions() if e["name"] == name]
        if not final or ex["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            return ex
        time.sleep(0.05)


# ---- restart between intent and execution name ----------------------------------------------------
async def test_crash_after_run_before_the_handle_launches_exactly_one_execution(fake: gcp.FakeCloudRun,
                                                                             gcs: CloudTarget, home: Path) -> None:
    from controlplane import api

    gcp.cloud_run_catalog(home)
    settings = Settings(home=home, object_store_url=gcs.url, **FAST)
    first = ControlPlane(settings)
    tid = first.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"log_lines": 3}))["task_id"]
    [claimed] = first.store.jobs.claim_for_launch("cloudrun", 4)  # the launch intent, committed
    task, job = claimed
    first.scheduler._write_inputs(task)
    first.providers["cloud_run"].launch(first.build_spec(task, job))  # RunJob went through...
    del first  # ...and the control plane died before recording the execution

    second = ControlPlane(settings)
    assert second.store.jobs.get(AttemptRef(tid, 1)).state == "launching"
    async with Client(build_server(second)) as client:
        st = await Agent(client).wait(tid, timeout=60)
    assert st["state"] == "succeeded"
    assert fake.runs[job.job_name] == 1  # found by its marker, not run again
    assert json.loads(second.store.jobs.get(AttemptRef(tid, 1)).handle_json)["execution"] == execution_of(fake, tid)["name"]


# ---- throttling -----------------------------------------------------------------------------------
async def test_throttled_apis_fail_no_task_and_run_nothing_twice(fake: gcp.FakeCloudRun, gcs: CloudTarget,
                                                                 home: Path) -> None:
    gcp.cloud_run_catalog(home)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    fake.fault_rate = 0.3  # 429 or 503 to a third of all Admin API and Logging requests
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tids = [await agent.submit(inputs={"sleep_s": 0.3, "log_lines": 3}) for _ in range(6)]
        cancel_me = await agent.submit(inputs={"sleep_s": 60})
        await agent.wait(cancel_me, {"running"}, timeout=120)
        await agent.call("cancel_task", task_id=cancel_me)
        states = [(await agent.wait(t, timeout=120))["state"] for t in tids]
        assert (await agent.wait(cancel_me, timeout=120))["state"] == "cancelled"
    assert states == ["succeeded"] * 6 and fake.faults > 5
    assert sorted(fake.runs.values()) == [1] * 7  # no execution started twice for one attempt


async def test_log_reads_keep_to_the_quota_and_share_pages(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    tid = await run.agent.submit(inputs={"log_lines": 5})
    assert (await run.agent.wait(tid, timeout=60))["state"] == "succeeded"
    provider: CloudRunProvider = run.cp.providers["cloud_run"]
    provider.settings = provider.settings.model_copy(update={"log_reads_per_min": 3})
    ratelimit._registry.clear()
    run.fake.reset_counts()

    async def tail(limit: int = 50) -> dict[str, Any]:
        return await run.agent.call("tail_task_logs", task_id=tid, source="provider", limit=limit)

    pages: list[dict[str, Any]] = []

    async def one() -> None:
        pages.append(await tail())

    async with anyio.create_task_group() as tg:  # four agents tail the same task at once
        for _ in range(4):
            tg.start_soon(one)
    reads = [r for r in run.fake.requests if r[2].endswith("entries:list")]
    assert len(reads) == 1  # one read served them all
    assert all([ln["message"] for ln in p["lines"] if ln["message"].startswith("line ")] ==
               [f"line {i}" for i in range(5)] for p in pages)
    answers = [await tail(limit) for limit in (49, 48, 47)]  # other pages: each read takes a place
    assert "allows 3 reads a minute" in answers[-1]["reason"] and answers[-1]["lines"] == []
    assert len([r for r in run.fake.requests if r[2].endswith("entries:list")]) == 3  # quota of 3, never exceeded


# ---- the status table -------------------------------------------------------------------------------
def test_a_poll_lists_one_short_page_where_its_executions_are(fake: gcp.FakeCloudRun, tmp_path: Path) -> None:
    """A job that keeps many executions, the watched ones its newest (a sweep's running shards):
    a poll is one ListExecutions call of a short page, not a page of every execution the job
    keeps. A watched execution further down costs one full listing once; the next poll's short
    page reaches down to it."""
    p = CloudRunProvider.configured(tmp_path, poll_interval_s=0.1)
    job = f"projects/{PROJECT}/locations/{REGION}/jobs/{gcp.JOB}"
    [old] = fake.add_executions(PROJECT, REGION, gcp.JOB, 1)
    newer = fake.add_executions(PROJECT, REGION, gcp.JOB, 300)

    def handle(name: str) -> CloudRunHandle:
        return CloudRunHandle(execution=name, job=job, job_name="cp-x", created_at=time.time())

    def polled(names: list[str]) -> tuple[int, set[str]]:
        """ListExecutions calls one poll made, and the raw statuses it answered."""
        fake.requests.clear()
        statuses = p.poll([handle(n) for n in names])
        lists = [r for r in fake.requests if r[1] == "GET" and r[2].endswith(f"/jobs/{gcp.JOB}/executions")]
        return len(lists), {st.raw_status for st in statuses}

    assert polled(newer[-10:]) == (1, {"RUNNING"})  # the ten newest: one page of 40, not 300
    assert polled([old, *newer[-10:]]) == (2, {"RUNNING"})  # the oldest too: the short page, then all
    assert polled([old, *newer[-10:]]) == (1, {"RUNNING"})  # now one page that reaches it
    assert polled(newer[-10:]) == (1, {"RUNNING"})


def test_every_execution_state_maps_onto_a_phase(fake: gcp.FakeCloudRun) -> None:
    from google.cloud import run_v2

    def status(**overrides: Any) -> Any:
        ex = run_v2.Execution(name="x", running_count=overrides.pop("running", 0),
                              succeeded_count=overrides.pop("succeeded", 0))
        cond = overrides.pop("completed", None)
        if cond is not None:
            ex.conditions.append(run_v2.Condition(type_="Completed", state=cond[0], execution_reason=cond[1],
                                                  message=cond[2]))
        ex.create_time = overrides.pop("created", None) or ex.create_time
        return execution_status(ex, time.time(), overrides.pop("stuck", 900), overrides.pop("on_stuck", "wait"))

    S = run_v2.Condition.State
    R = run_v2.Condition.ExecutionReason
    assert status().phase == JobPhase.PENDING
    assert status(completed=(S.CONDITION_PENDING, 0, "")).phase == JobPhase.PENDING
    assert status(running=1, completed=(S.CONDITION_RECONCILING, 0, "")).raw_status == "RUNNING"
    assert status(completed=(S.CONDITION_RECONCILING, R.CANCELLING, "")).raw_status == "CANCELLING"
    assert status(completed=(S.CONDITION_SUCCEEDED, 0, "")).phase == JobPhase.SUCCEEDED
    failed = status(completed=(S.CONDITION_FAILED, R.NON_ZERO_EXIT_CODE, "exit code 3"))
    assert failed.phase == JobPhase.FAILED and failed.reason == "NON_ZERO_EXIT_CODE: exit code 3"
    assert status(completed=(S.CONDITION_FAILED, R.CANCELLED, "")).raw_status == "CANCELLED"
    assert status(completed=(S.CONDITION_FAILED, R.DELETED, "")).phase == JobPhase.GONE
    ending = status(completed=(S.CONDITION_RECONCILING, 0, ""), succeeded=1)
    assert (ending.phase, ending.raw_status, ending.waiting_reason) == (JobPhase.RUNNING, "ENDING", None)
    timeout = status(completed=(S.CONDITION_FAILED, 0, "exceeded the configured timeout"))
    assert timeout.phase == JobPhase.FAILED and "timeout" in timeout.reason
    from datetime import UTC, datetime

    old = datetime.fromtimestamp(time.time() - 3600, UTC)
    stuck = status(created=old, stuck=60, on_stuck="fail")
    assert stuck.phase == JobPhase.PENDING and stuck.waiting_reason.startswith("PENDING for 60 min")
    assert stuck.give_up_reason and status(created=old, stuck=60).give_up_reason is None


# ---- the provider contract suite --------------------------------------------------------------------
class CloudRunHarness(Harness):
    log_quota_setting = "log_reads_per_min"

    def __init__(self, home: Path, fake: gcp.FakeCloudRun):
        self.fake = self.capacity = self.faults = fake  # start_jobs, fault_rate
        fake.create_job(PROJECT, REGION, "contract", command=RUNNER)
        fake.create_job(PROJECT, REGION, "contract-b", command=RUNNER)
        self.provider = CloudRunProvider.configured(home, poll_interval_s=0.1)
        self.options = CloudRunOptions(project=PROJECT, region=REGION, job="contract")
        self._n = 0

    def spec(self, job_name: str, script: str, **kw: Any) -> Any:
        # Alternate between two jobs so that one poll spans several poll groups.
        self._n += 1
        spec = super().spec(job_name, script, **kw)
        from dataclasses import replace

        job = "contract" if self._n % 2 else "contract-b"
        return replace(spec, options=CloudRunOptions(project=PROJECT, region=REGION, job=job))

    def count_jobs(self, job_name: str) -> int:
        return sum(1 for e in self.fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == job_name)

    def forget(self, handle: CloudRunHandle) -> None:
        self.fake.forget(handle.execution)

    def log_reads(self) -> int:
        return _entries_calls(self.fake)



class TestCloudRunContract(ProviderContract):
    @pytest.fixture
    def harness(self, fake: gcp.FakeCloudRun, tmp_path: Path) -> CloudRunHarness:
        return CloudRunHarness(tmp_path, fake)


# ---- the edges (issue 30): a job that reruns, log reads, nanoseconds, a reconciling end, a lagging list --
async def test_a_job_that_would_rerun_a_failed_task_is_refused_at_first_use(fake: gcp.FakeCloudRun, gcs: CloudTarget,
                                                                           home: Path) -> None:
    """A job made by hand keeps Cloud Run's default maxRetries of 3: a failed tool would run four
    times for one attempt. The launch is refused with a message that says what to set."""
    fake.create_job(PROJECT, REGION, "by-hand", command=RUNNER, args=["python", "-m", "controlplane_tools.exercise"],
                    max_retries=None)
    gcp.cloud_run_catalog(home, job="by-hand")
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        st = await agent.wait(await agent.submit(inputs={"exit_code": 3}), timeout=60)
    assert st["state"] == "failed" and st["error"]["code"] == "LAUNCH_FAILED", st
    assert "by-hand reruns a failed task (maxRetries 3)" in st["error"]["message"]
    assert "--max-retries 0" in st["error"]["message"]
    assert fake.executions("by-hand") == [] and fake.runs == {}


def _handle(fake: gcp.FakeCloudRun, job: str = JOB) -> CloudRunHandle:
    [name] = fake.add_executions(PROJECT, REGION, job, 1)
    return CloudRunHandle(execution=name, job=f"projects/{PROJECT}/locations/{REGION}/jobs/{job}", job_name="x",
                          created_at=time.time() - 5)


def _entries_calls(fake: gcp.FakeCloudRun) -> int:
    return len([r for r in fake.requests if r[2].endswith("entries:list")])


def test_one_log_read_is_one_counted_call(fake: gcp.FakeCloudRun, tmp_path: Path) -> None:
    """A tail of `limit` lines costs one entries.list call, also when more lines follow; an
    answer "search not finished" costs one, and the next read continues it; every HTTP call the
    logging client makes is counted by the project's read limiter."""
    provider = CloudRunProvider.configured(tmp_path)
    h = _handle(fake)
    for i in range(70):  # more than a page of any size a tail of 5 asks for
        fake.add_log(PROJECT, REGION, JOB, h.execution, f"line {i}")
    fake.reset_counts()
    page = provider.logs(h, None, 5)
    assert [ln.message for ln in page.lines] == [f"line {i}" for i in range(5)] and _entries_calls(fake) == 1
    page = provider.logs(h, page.next_cursor, 5)
    assert [ln.message for ln in page.lines] == [f"line {i}" for i in range(5, 10)] and _entries_calls(fake) == 2

    fake.unfinished_searches = 1
    waiting = provider.logs(h, page.next_cursor, 5)
    assert waiting.lines == [] and "not finished" in (waiting.reason or "") and _entries_calls(fake) == 3
    rest = provider.logs(h, waiting.next_cursor, 5)
    assert [ln.message for ln in rest.lines] == [f"line {i}" for i in range(10, 15)] and _entries_calls(fake) == 4
    limiter = ratelimit._registry[ratelimit.key("logging", account=PROJECT, endpoint=fake.url)]
    assert limiter.calls == _entries_calls(fake) == 4


def test_log_lines_closer_than_a_microsecond_come_once_each_in_order(fake: gcp.FakeCloudRun, tmp_path: Path) -> None:
    """Cloud Logging stamps in nanoseconds and orders by timestamp, then insertId: a tail one line
    at a time returns every line once, whether lines share a microsecond or an instant."""
    provider = CloudRunProvider.configured(tmp_path)
    h = _handle(fake)
    base = "2030-01-02T03:04:05.123456"
    # Within one microsecond: insertIds that do not grow with time, and two instants shared.
    for i, (ns, iid) in enumerate([("001", "m"), ("002", "c"), ("002", "k"), ("500", "a"), ("999", "b"),
                                   ("999", "z"), ("999", "d")]):
        fake.add_log(PROJECT, REGION, JOB, h.execution, f"line {i}", ts=f"{base}{ns}Z", insert_id=iid)
    fake.add_log(PROJECT, REGION, JOB, h.execution, "line 7", ts="2030-01-02T03:04:05.123457Z")  # 6 digits on the wire
    h = CloudRunHandle(**{**h.__dict__, "created_at": datetime.fromisoformat("2030-01-02T03:04:00+00:00").timestamp()})
    expected = [e["textPayload"] for e in fake.log_entries(h.execution)]  # the service's order
    seen, cursor = [], None
    for _ in range(12):
        page = provider.logs(h, cursor, 1)
        seen += [ln.message for ln in page.lines]
        cursor = page.next_cursor
    assert seen == expected and sorted(seen) == [f"line {i}" for i in range(8)]


def test_an_execution_whose_tasks_ended_is_ending_not_waiting_to_start(fake: gcp.FakeCloudRun, tmp_path: Path) -> None:
    """Tasks ended, Completed still reconciling (no task running, one succeeded): RUNNING
    (ENDING) with its start time, never "waiting for the execution to start"."""
    from tests.provider_contract import PRINT_LINES, unique, wait_for

    harness = CloudRunHarness(tmp_path, fake)
    fake.reconcile_s = 4
    p = harness.provider
    h = p.launch(harness.spec(unique("ending"), PRINT_LINES.format(n=1, code=0)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and run_state(fake, h) != "ending":
        time.sleep(0.05)
    assert run_state(fake, h) == "ending"
    [st] = p.poll([h])
    assert (st.phase, st.raw_status, st.waiting_reason) == (JobPhase.RUNNING, "ENDING", None)
    assert st.started_at is not None and st.started_at <= time.time()
    assert wait_for(p, h, {JobPhase.SUCCEEDED}).phase == JobPhase.SUCCEEDED


def run_state(fake: gcp.FakeCloudRun, h: CloudRunHandle) -> str:
    return next(e["state"] for e in fake.executions() if e["name"] == h.execution)


async def test_an_ambiguous_run_job_under_a_lagging_list_launches_once(run: Run) -> None:
    """RunJob creates the execution and answers 503; the list shows it only 3 s later. The
    scheduler's look-up before launching again does not take one empty list as proof."""
    provider: CloudRunProvider = run.cp.providers["cloud_run"]
    provider.settings = provider.settings.model_copy(update={"list_lag_s": 20.0})
    run.fake.list_lag_s = 3.0
    run.fake.pending_s = 2.0  # its runner cannot report (and so reveal it) before the look-up
    run.fake.ambiguous_runs = 1
    tid = await run.agent.submit(inputs={"sleep_s": 0.5})
    st = await run.agent.wait(tid, timeout=90)
    assert st["state"] == "succeeded", st
    name = f"cp-{tid.removeprefix('tsk_')}-a1"
    assert run.fake.runs[name] == 1
    assert [e["env"]["CONTROLPLANE_JOB_NAME"] for e in run.fake.executions()].count(name) == 1


async def test_a_late_second_launch_of_an_attempt_runs_nothing(run: Run) -> None:
    """A leader paused past its lease runs the Cloud Run job again for an attempt its successor
    already started: the second execution's runner is refused the claim and runs nothing."""
    await a_late_launch_runs_nothing(run.cp, run.agent)


async def test_a_recorded_execution_refused_its_claim_leaves_the_attempt_to_the_holder(run: Run) -> None:
    """The late launch claimed first: the job follows the execution that holds the claim."""
    await a_recorded_execution_refused_its_claim_is_left_for_the_holder(run.cp, run.agent)
