"""An extra execution of a running attempt on Container Apps (the fake, the real runner and SDK):
a late second start of the attempt (a paused leader's) whose execution goes on Running after its
runner was refused the claim and exited (the fake's `linger`) is stopped by the reconciler, while
the first delivers the task's result once. Both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.ops import metrics
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from tests import azure
from tests.conftest import FAST, Agent
from tests.exactly_once import claimed_by_its_runner
from tests.test_container_apps import catalog, settings_env

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[azure.FakeAzure]:
    with azure.FakeAzure(seed=13) as fake:
        fake.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in settings_env(fake).items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()
        yield fake


@pytest.fixture
async def plane(fake: azure.FakeAzure, home: Path) -> AsyncIterator[tuple[ControlPlane, Agent]]:
    catalog(home, local_store=True)
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        yield cp, Agent(client)


def stopped_on_aca() -> float:
    return metrics.REGISTRY.get_sample_value("controlplane_extra_executions_total",
                                             {"provider": "container_apps", "action": "stopped"}) or 0.0


def status_of(fake: azure.FakeAzure, name: str) -> str:
    [ex] = [e for e in fake.executions() if e["name"] == name]
    return str(ex["status"])


async def test_a_late_execution_that_outlives_its_refused_runner_is_stopped(
        fake: azure.FakeAzure, plane: tuple[ControlPlane, Agent]) -> None:
    cp, agent = plane
    before = stopped_on_aca()
    fake.linger = True  # an execution goes on Running after its container exited, until stopped
    tid = await agent.submit(inputs={"sleep_s": 4, "log_lines": 3, "result": {"once": True}})
    await claimed_by_its_runner(cp, tid)
    task, job = cp.store.tasks.get(tid), cp.store.jobs.get(AttemptRef(tid, 1))
    assert task is not None and job is not None
    provider = cp.providers["container_apps"]
    late = await anyio.to_thread.run_sync(provider.launch, cp.build_spec(task, job))
    own = provider.handle(job.handle_json)
    assert not provider.same_job(late, own)

    for _ in range(300):  # refused, its runner exits 75; the execution runs on until the reconciler stops it
        # (its stop shows on the fake before the reconciler records it: wait for the record)
        ended = status_of(fake, late.execution) in ("Succeeded", "Failed")
        if ended or cp.store.jobs.get(AttemptRef(tid, 1)).extra_stopped:
            break
        await anyio.sleep(0.1)
    assert cp.store.jobs.get(AttemptRef(tid, 1)).extra_stopped == 1
    for _ in range(100):
        if status_of(fake, late.execution) == "Stopped":
            break
        await anyio.sleep(0.1)
    assert status_of(fake, late.execution) == "Stopped"
    assert stopped_on_aca() == before + 1

    st = await agent.wait(tid, timeout=90)
    assert st["state"] == "succeeded" and st["attempt"] == 1, st
    assert (await agent.call("get_task_result", task_id=tid))["result"]["once"] is True
    assert [ln["message"] for ln in await agent.all_logs(tid)] == ["line 0", "line 1", "line 2"]
    row = cp.store.jobs.get(AttemptRef(tid, 1))
    assert row.extra_claims >= 1 and row.extra_checked == row.extra_claims and row.extra_stopped == 1
