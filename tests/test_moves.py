"""Moves: a launched job that waits to start past its placement's patience is stopped, confirmed
stopped, and only then is its attempt moved to the tool's next placement, spending no retry
budget; a job that starts just as its patience runs out runs where it is (or, if it starts after
the control plane took its attempt's claim, runs nothing); a restart between the stop and the
attempt's end finishes the move once; what an agent and an operator see of it (status, audit,
metrics, cost rows, the dashboard's task page).

The waiting placement is Cloud Run on its wire-level fake (`tests/gcp.py`, executions kept pending:
no capacity), the next one the real local provider; results and artifacts are in GCS on its
emulator, which both reach. AWS Batch on moto (a job stuck RUNNABLE past `stuck_after_s`) and
Container Apps on its fake (an execution left Processing) move the same way."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.catalog import default_catalog_text
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.objectstore.claim import claim_key
from controlplane.ops import metrics
from controlplane.placement import NO_CAPACITY
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from controlplane_providers.cloud_run import CloudRunProvider
from tests import aws, gcp
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import CloudTarget, gcs_server, gcs_target, moto_server  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent, serving

pytestmark = pytest.mark.anyio
pytest.importorskip("google.cloud.run_v2")

EXERCISE = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
CLOUD_RUN = f'provider = "cloud_run", provider_options = {{ project = "{gcp.PROJECT}", region = "{gcp.REGION}", job = "{gcp.JOB}" }}'
PATIENCE_S = 1.5


def catalog(home: Path, placements: str) -> None:
    """The default catalog with `exercise` placed by `placements` (a TOML list's items)."""
    text_ = default_catalog_text()
    assert EXERCISE in text_
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(text_.replace(EXERCISE, f"placements = [{placements}]\n"
                                       'resource_class = "cpu_small"\n'
                                       'command = ["{python}", "-m", "controlplane_tools.exercise"]'))


TWO = f'{{ {CLOUD_RUN}, patience_s = {PATIENCE_S} }}, {{ provider = "local" }}'


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[gcp.FakeCloudRun]:
    with gcp.FakeCloudRun(start_jobs=False) as fake:  # no capacity: executions stay pending
        fake.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER,
                        args=["python", "-m", "controlplane_tools.exercise"])
        for k, v in {"ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.2",
                     "MAX_TPS": "500", "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "1"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        ratelimit._registry.clear()
        yield fake


@pytest.fixture
def gcs(gcs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CloudTarget:  # noqa: F811
    target = gcs_target(gcs_server, tmp_path)
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)  # the runners (the fake's processes and local jobs) inherit them
    return target


def moves_counted(provider: str = "cloud_run", why: str = "patience") -> float:
    return metrics.MOVES.labels("exercise", "0", provider, why)._value.get()


async def until(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.05)


def first_job(cp: ControlPlane, tid: str) -> Any:
    return cp.store.jobs.get(AttemptRef(tid, 1))


def launched(cp: ControlPlane, tid: str) -> bool:
    job = first_job(cp, tid)
    return job is not None and job.launched_at is not None


async def test_a_job_waiting_past_its_patience_is_stopped_then_moves_and_runs_once(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    catalog(home, TWO)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, auth_tokens="tok-a=alice", **FAST))
    before = moves_counted()
    async with serving(cp) as server, Client(server.url, auth="tok-a") as client, httpx.AsyncClient() as http:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 2})
        await until(lambda: launched(cp, tid))
        st = await agent.call("get_task_status", task_id=tid)
        assert (st["state"], st["provider"], st["placement"], st["moves"]) == ("scheduled", "cloud_run", 0, [])
        done = await agent.wait(tid, timeout=90)
        # what an operator sees: /metrics counts the move, the dashboard's task page lists it
        root = server.url.removesuffix("/mcp")
        exposed = (await http.get(f"{root}/metrics")).text
        assert ('controlplane_moves_total{placement="0",provider="cloud_run",reason="patience",tool="exercise"} '
                f"{before + 1}") in exposed
        assert (await http.post(f"{root}/dashboard/login", data={"token": "tok-a"})).status_code == 303
        page = (await http.get(f"{root}/dashboard/tasks/{tid}")).text
        assert 'id="moves"' in page and "cloud_run (placement 0)" in page and "past the placement&#39;s patience" in page
        assert "local (placement 1)" in page  # where it runs now
    assert done["state"] == "succeeded" and done["attempt"] == 2
    assert (done["provider"], done["placement"]) == ("local", 1)
    [move] = done["moves"]
    assert (move["attempt"], move["placement"], move["provider"]) == (1, 0, "cloud_run")
    assert "past the placement's patience (1.5 s)" in move["reason"] and move["at"]

    # stopped first, and it never started: nothing ran twice
    first = first_job(cp, tid)
    [ex] = fake.executions()
    assert ex["state"] == "cancelled" and ex["pid"] is None and fake.runs.get(first.job_name, 0) == 0
    assert first.state == "done" and first.provider_status == NO_CAPACITY and first.stop_sent_at is not None
    task = cp.store.tasks.get(tid)
    assert task is not None and task.failures == 0 and task.recoveries == 0  # no retry budget spent
    # the audit records the move: off which placement, and why
    [retry] = [e.detail for e in cp.store.logs.events(tid) if e.kind == "retry"]
    assert retry["retry"] == "elsewhere" and (retry["placement"], retry["provider"]) == (0, "cloud_run")
    assert "patience" in retry["reason"]
    assert moves_counted() == before + 1
    # cost per attempt where it ran: the attempt that never started has no usage row
    with cp.db.read() as c:
        used = c.execute(text("SELECT attempt, provider FROM attempt_usage WHERE task_id = :t"), {"t": tid}).all()
    assert [tuple(r) for r in used] == [(2, "local")]


async def test_a_job_that_starts_as_its_patience_runs_out_runs_where_it_is(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The poll sees the execution pending past its patience, and the execution starts (its runner
    claims the attempt) before that answer arrives: the move is given up (or, when the runner's
    report that it started lands first, never begun), the job runs. The
    reconciler's cycles are driven here, so that the race is the one in the cycle that decides."""
    catalog(home, TWO)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **{**FAST, "reconcile_interval_s": 3600}))
    store = cp.object_stores.get(gcs.url)
    raced: list[str] = []

    def start_during_the_poll(method: str, path: str) -> None:
        if raced or method != "GET" or "/executions" not in path:
            return
        raced.append(path)  # the answer (pending) is made: the execution starts before it arrives
        [ex] = fake.executions()
        fake.start(ex["name"])
        deadline = time.monotonic() + 30
        while store.stat(claim_key(AttemptRef(tid, 1))) is None:  # its runner claimed the attempt
            assert time.monotonic() < deadline
            time.sleep(0.02)

    caplog.set_level(logging.WARNING, logger="controlplane.reconciler")
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 2})
        await until(lambda: launched(cp, tid))
        await cp.reconciler.cycle(force_poll=True)  # pending, within its patience
        assert first_job(cp, tid).provider_status == "PENDING"
        await anyio.sleep(first_job(cp, tid).launched_at + PATIENCE_S + 0.1 - time.time())
        fake.answer_hook = start_during_the_poll
        await cp.reconciler.cycle(force_poll=True)
        assert raced
        # The move begins and finds the runner's claim, or the runner's word that it started reached
        # the control plane first and no move began (the task no longer `scheduled`): either way it runs.
        gave_up = any("started before it could move" in r.getMessage() for r in caplog.records)
        assert gave_up or (await agent.call("get_task_status", task_id=tid))["state"] in ("running", "succeeded")
        done = await agent.wait(tid, timeout=90)
    assert done["state"] == "succeeded" and done["attempt"] == 1
    assert (done["provider"], done["placement"], done["moves"]) == ("cloud_run", 0, [])
    assert [j.attempt for j in cp.store.jobs.of_task(tid)] == [1]  # no second attempt anywhere
    assert fake.runs[first_job(cp, tid).job_name] == 1


async def test_a_job_that_starts_after_the_claim_was_taken_runs_nothing_and_moves(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    """The execution starts as the stop is sent, after the move took the attempt's claim: its
    runner is refused the claim and runs no tool; the attempt moves once the job has ended."""
    catalog(home, TWO)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))

    def start_before_the_cancel(method: str, path: str) -> None:
        if method == "POST" and path.endswith(":cancel"):
            [ex] = fake.executions()
            fake.start(ex["name"])  # (the cancel was applied to a pending execution: started, it stops)

    fake.ignore_cancel = True  # the first stop does not land: the execution starts instead
    fake.answer_hook = start_before_the_cancel
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 2})
        await until(lambda: bool(fake.runs))
        fake.answer_hook, fake.ignore_cancel = None, False
        done = await agent.wait(tid, timeout=90)
    assert done["state"] == "succeeded" and done["attempt"] == 2 and done["provider"] == "local"
    first = first_job(cp, tid)
    assert fake.runs[first.job_name] == 1 and first.extra_claims == 1  # it started, and was refused the claim
    logged = cp.store.logs.tail(tid, 0, 100)
    assert [ln for ln in logged if ln.attempt == 1] == [] and any(ln.attempt == 2 for ln in logged)  # ran in 2 only
    [move] = done["moves"]
    assert move["provider"] == "cloud_run"


async def test_a_restart_between_the_stop_and_the_end_finishes_the_move_once(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    catalog(home, TWO)
    settings = Settings(home=home, object_store_url=gcs.url, **FAST)
    fake.ignore_cancel = True  # the stop is sent, and not confirmed before the control plane dies
    before = moves_counted()
    first = ControlPlane(settings)
    async with Client(build_server(first)) as client:
        tid = await Agent(client).submit(inputs={"log_lines": 1})
        await until(lambda: (j := first_job(first, tid)) is not None and j.stop_sent_at is not None)
    job = first_job(first, tid)
    assert job.provider_status == "moving:patience" and job.state == "active"  # the move, in the database
    assert first.store.tasks.get(tid).state == "scheduled"
    first.db.dispose()  # the first control plane is gone

    fake.ignore_cancel = False  # the stop lands while no control plane runs
    [ex] = fake.executions()
    provider = CloudRunProvider.configured(home)
    provider.cancel(provider.handle(job.handle_json))
    assert fake.executions()[0]["state"] == "cancelled"

    second = ControlPlane(settings)
    async with Client(build_server(second)) as client:
        done = await Agent(client).wait(tid, timeout=90)
    assert done["state"] == "succeeded" and done["attempt"] == 2 and done["provider"] == "local"
    assert len(done["moves"]) == 1 and ex["pid"] is None
    assert [e.detail["retry"] for e in second.store.logs.events(tid) if e.kind == "retry"] == ["elsewhere"]
    assert moves_counted() == before + 1


async def test_patience_counts_from_the_recorded_launch_across_a_restart(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    """A job launched by one control plane, which then stops, moves as soon as the next one
    looks at it once its patience has passed since the launch the database records: the clock
    is not started again by the process that first sees it."""
    patience = 6.0
    catalog(home, f'{{ {CLOUD_RUN}, patience_s = {patience} }}, {{ provider = "local" }}')
    settings = Settings(home=home, object_store_url=gcs.url, **FAST)
    first = ControlPlane(settings)
    async with Client(build_server(first)) as client:
        tid = await Agent(client).submit(inputs={"log_lines": 1})
        await until(lambda: launched(first, tid))
    job = first_job(first, tid)
    assert job.provider_status != "moving:patience" and first.store.tasks.get(tid).state == "scheduled"
    first.db.dispose()  # the first control plane is gone before the job's patience ran out
    assert job.launched_at is not None and time.time() < job.launched_at + patience
    await anyio.sleep(job.launched_at + patience + 0.5 - time.time())

    second = ControlPlane(settings)
    async with Client(build_server(second)) as client:
        started = time.monotonic()
        await until(lambda: (first_job(second, tid).provider_status or "").startswith("moving:")
                    or first_job(second, tid).state != "active", timeout=30)
        assert time.monotonic() - started < patience / 2  # at its first look, not a patience later
        done = await Agent(client).wait(tid, timeout=90)
    assert done["state"] == "succeeded" and done["attempt"] == 2 and done["provider"] == "local"
    [move] = done["moves"]
    waited = float(move["reason"].split("waited ", 1)[1].split(" s", 1)[0])
    assert waited >= patience


async def test_with_one_placement_a_waiting_job_keeps_waiting(fake: gcp.FakeCloudRun, gcs: CloudTarget,
                                                               home: Path) -> None:
    catalog(home, f"{{ {CLOUD_RUN}, patience_s = 0.5 }}")
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 1})
        await until(lambda: launched(cp, tid))
        await anyio.sleep(2.5)
        st = await agent.call("get_task_status", task_id=tid)
        assert (st["state"], st["attempt"], st["provider"]) == ("scheduled", 1, "cloud_run")
        assert st.get("placement") is None and st.get("moves") is None
        [ex] = fake.executions()
        assert ex["state"] == "pending" and not ex["cancel_requested"]
        await agent.call("cancel_task", task_id=tid)
        assert (await agent.wait(tid))["state"] == "cancelled"


# ---- AWS Batch: a job stuck RUNNABLE past stuck_after_s is a refusal for room ---------------------
async def test_a_batch_job_stuck_runnable_moves_when_there_is_another_placement(moto: str, home: Path) -> None:  # noqa: F811
    name = f"cp-{secrets.token_hex(5)}"
    aws.client("s3", moto).create_bucket(Bucket=name)
    catalog(home, f'{{ provider = "aws_batch", provider_options = {{ job_queue = "{aws.QUEUE}", '
                  f'job_definition = "{aws.JOB_DEFINITION}", stuck_after_s = 1 }} }}, {{ provider = "local" }}')
    cp = ControlPlane(Settings(home=home, object_store_url=f"s3://{name}/runs", **FAST))
    before = moves_counted("aws_batch", "stuck")
    with aws.BatchExecutor(moto, start_jobs=False):  # no compute: jobs stay RUNNABLE
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={"log_lines": 1})
            done = await agent.wait(tid, timeout=90)
    assert done["state"] == "succeeded" and done["attempt"] == 2 and done["provider"] == "local"
    [move] = done["moves"]
    assert move["provider"] == "aws_batch" and "RUNNABLE" in move["reason"] and "compute capacity" in move["reason"]
    [job] = aws.client("batch", moto).list_jobs(jobQueue=aws.QUEUE, filters=[
        {"name": "JOB_NAME", "values": [first_job(cp, tid).job_name]}])["jobSummaryList"]
    assert job["status"] == "FAILED" and job["statusReason"] == "controlplane: moving to another placement"
    assert not job.get("startedAt")  # it never ran (moto says 0)
    task = cp.store.tasks.get(tid)
    assert task is not None and task.failures == 0 and task.recoveries == 0
    assert moves_counted("aws_batch", "stuck") == before + 1


# ---- Container Apps: an execution that stays Processing past its patience ----------------------------
async def test_a_container_apps_execution_waiting_past_its_patience_moves(home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import azure
    from tests.test_container_apps import settings_env

    with azure.FakeAzure(start_jobs=False) as fake:  # no capacity: executions stay Processing
        fake.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in settings_env(fake).items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()
        # (the fake runs executions on this machine, where the control plane's local store is)
        catalog(home, f'{{ provider = "container_apps", provider_options = {{ resource_group = "{azure.RESOURCE_GROUP}", '
                      f'job = "{azure.JOB}" }}, patience_s = {PATIENCE_S}, reachable_stores = ["file://"] }}, '
                      '{ provider = "local" }')
        cp = ControlPlane(Settings(home=home, **FAST))
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={"log_lines": 1})
            done = await agent.wait(tid, timeout=90)
        executions = fake.executions()
    assert done["state"] == "succeeded" and done["attempt"] == 2 and done["provider"] == "local"
    [move] = done["moves"]
    assert move["provider"] == "container_apps" and "patience" in move["reason"]
    [ex] = executions
    assert not fake.runs and ex["stop_requested"] and ex["status"] == "Stopped"  # stopped before it ever started
    task = cp.store.tasks.get(tid)
    assert task is not None and task.failures == 0 and task.recoveries == 0


async def test_a_task_cancelled_during_its_move_is_cancelled_and_runs_nowhere(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    catalog(home, TWO)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    fake.ignore_cancel = True  # the move's stop does not land at once
    before = moves_counted()
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 1})
        await until(lambda: (j := first_job(cp, tid)) is not None and j.stop_sent_at is not None)
        assert (await agent.call("get_task_status", task_id=tid))["waiting_reason"].startswith("the job waited")
        await agent.call("cancel_task", task_id=tid)
        fake.ignore_cancel = False
        done = await agent.wait(tid, timeout=60)
    assert done["state"] == "cancelled" and done["attempt"] == 1 and done["moves"] == []
    assert [j.attempt for j in cp.store.jobs.of_task(tid)] == [1]  # no attempt elsewhere
    assert fake.executions()[0]["state"] == "cancelled" and not fake.runs
    assert moves_counted() == before  # a cancel, not a move
