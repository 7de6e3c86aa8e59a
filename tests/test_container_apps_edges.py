"""Container Apps and Log Analytics at their edges, on the fake (`tests/azure.py`) driven by the real
azure-mgmt-appcontainers and azure-monitor-query clients: more rows at one instant than a page,
times written at any precision, both log destinations' tables, a start answered by a bare 202, a
list without templates, and an execution that runs on after its runner reported the end (stopped
until Azure says it ended, abandoned if it never does)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from controlplane_providers.base import TransientProviderError
from controlplane_providers.container_apps import ContainerAppsHandle, ContainerAppsOptions, ContainerAppsProvider
from tests import azure
from tests.conftest import FAST, Agent
from tests.test_container_apps import ContainerAppsHarness, catalog, execution_of, settings_env

pytestmark = pytest.mark.anyio
RG, JOB = azure.RESOURCE_GROUP, azure.JOB


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[azure.FakeAzure]:
    with azure.FakeAzure(seed=11) as fake:
        fake.create_job(RG, JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in settings_env(fake).items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()
        yield fake


def handle_of(name: str) -> ContainerAppsHandle:
    return ContainerAppsHandle(execution=name, job=ContainerAppsOptions(resource_group=RG, job=JOB).job_id(
        azure.SUBSCRIPTION), job_name=name, created_at=time.time() - 60, workspace_id=azure.WORKSPACE)


def tail(provider: ContainerAppsProvider, handle: ContainerAppsHandle, limit: int, most: int = 100) -> list[str]:
    """Every line, page by page, until a page comes back empty."""
    seen: list[str] = []
    cursor = None
    for _ in range(most):
        page = provider._read_logs(handle, cursor, limit)
        assert page.reason is None, page.reason
        if not page.lines:
            return seen
        seen += [ln.message for ln in page.lines]
        cursor = page.next_cursor
    raise AssertionError(f"the tail did not end in {most} pages: {len(seen)} lines, cursor {cursor}")


# ---- the log tail ----------------------------------------------------------------------------------
def test_more_rows_at_one_instant_than_a_page_are_each_read_once(fake: azure.FakeAzure, tmp_path: Path) -> None:
    """200 rows share one TimeGenerated (a burst within 100 ns): pages of 10 read them all once,
    then the next instant's row; the query asks for one page, not limit + 50 rows."""
    provider = ContainerAppsProvider.configured(tmp_path)
    [name] = fake.add_executions(RG, JOB, 1, status="Running")
    instant = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 30))
    for i in range(200):
        fake.add_log(RG, JOB, name, f"burst {i:03d}", ts=f"{instant}.5000000Z")
    fake.add_log(RG, JOB, name, "after", ts=f"{instant}.5000001Z")
    seen = tail(provider, handle_of(name), 10, most=40)
    assert sorted(seen[:200]) == [f"burst {i:03d}" for i in range(200)] and seen[200:] == ["after"]
    assert all("| take 10\n" in q for q, _ in fake.queries)


def test_cursors_do_not_depend_on_how_the_service_writes_times(fake: azure.FakeAzure, tmp_path: Path) -> None:
    """Log Analytics may write `...:00Z` and `...:00.1Z` (trailing zeros dropped): as text the
    first sorts after the second. Lines are read in time order, none lost, none twice."""
    fake.trim_datetimes = True
    provider = ContainerAppsProvider.configured(tmp_path)
    [name] = fake.add_executions(RG, JOB, 1, status="Running")
    second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 30))
    for i, frac in enumerate(["0000000", "1000000", "2500000", "2500000", "9999999"]):
        fake.add_log(RG, JOB, name, f"line {i}", ts=f"{second}.{frac}Z", item_id=f"item-{i}")
    assert fake.log_rows(name)[0]["TimeGenerated"].endswith(".0000000Z")  # (the fake's own record)
    for limit in (1, 2, 50):
        assert tail(provider, handle_of(name), limit) == [f"line {i}" for i in range(5)], limit
    rendered = provider._read_logs(handle_of(name), None, 1)
    assert rendered.next_cursor.split("|")[0] == f"{second}.0000000Z"  # cursors are written at full precision


@pytest.mark.parametrize("destination", ["log-analytics", "azure-monitor"])
def test_both_log_destinations_tables_are_read(destination: str, fake: azure.FakeAzure, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's logs go to ContainerAppConsoleLogs_CL ("log-analytics") or, through a
    diagnostic setting, to ContainerAppConsoleLogs ("azure-monitor"), with other column names:
    found by itself, or named by LOG_TABLE."""
    fake.log_destination = destination
    [name] = fake.add_executions(RG, JOB, 1, status="Running")
    for i in range(3):
        fake.add_log(RG, JOB, name, f"line {i}", ts=time.time() - 30 + i, stream="stderr" if i == 1 else "stdout")
    auto = ContainerAppsProvider.configured(tmp_path)
    page = auto._read_logs(handle_of(name), None, 10)
    assert [(ln.message, ln.stream) for ln in page.lines] == [("line 0", "stdout"), ("line 1", "stderr"),
                                                             ("line 2", "stdout")], page.reason
    assert tail(auto, handle_of(name), 2) == ["line 0", "line 1", "line 2"]
    table = {"log-analytics": "ContainerAppConsoleLogs_CL", "azure-monitor": "ContainerAppConsoleLogs"}[destination]
    assert all(q.startswith(table + "\n") for q, _ in fake.queries[1:])  # found once, then kept
    monkeypatch.setenv("CONTROLPLANE_CONTAINER_APPS_LOG_TABLE", table)
    named = ContainerAppsProvider.configured(tmp_path)
    fake.reset_counts()
    assert tail(named, handle_of(name), 5) == ["line 0", "line 1", "line 2"]
    assert all(q.startswith(table + "\n") for q, _ in fake.queries)


# ---- starting and finding --------------------------------------------------------------------------
def test_a_start_answered_by_a_bare_202_is_an_ambiguous_start(fake: azure.FakeAzure, tmp_path: Path) -> None:
    """The 2026-07-01 spec lets a start answer 202 with only `Location`: the provider finds the
    execution by its marker; while the list lags, it says so (transient) and never answers "not
    started", so nothing is started twice."""
    fake.start_body = False
    harness = ContainerAppsHarness(tmp_path, fake)
    provider = harness.provider
    spec = harness.spec("cp-bare202-a1", "print('hi')")
    handle = provider.launch(spec)
    assert handle.execution == execution_of_marker(fake, "cp-bare202-a1")["name"]

    fake.list_lag_s = 3.0
    lagging = harness.spec("cp-lagging-a1", "import time; time.sleep(30)")
    with pytest.raises(TransientProviderError, match="without naming its execution|does not list yet"):
        provider.launch(lagging)
    with pytest.raises(TransientProviderError, match="does not list yet"):
        provider.find(lagging)  # an empty look within LIST_LAG_S is not proof
    deadline = time.monotonic() + 20
    while (found := _find_or_none(provider, lagging)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found is not None and found.execution == execution_of_marker(fake, "cp-lagging-a1")["name"]
    assert harness.count_jobs("cp-lagging-a1") == 1


def test_find_reads_executions_listed_without_their_template(fake: azure.FakeAzure, tmp_path: Path) -> None:
    """An executions list without templates is no proof that nothing was started: each
    execution is read (once) before find answers."""
    fake.list_templates = False
    harness = ContainerAppsHarness(tmp_path, fake)
    spec = harness.spec("cp-notemplate-a1", "import time; time.sleep(30)")
    handle = harness.provider.launch(spec)
    fake.add_executions(RG, "contract", 2, status="Running")  # others of the job, newer
    found = harness.provider.find(spec)
    assert found is not None and found.execution == handle.execution
    fake.reset_counts()
    assert harness.provider.find(spec).execution == handle.execution
    assert [m for _, m, p in fake.requests if "/executions/" in p] == []  # markers read once are remembered
    assert harness.provider.find(harness.spec("cp-never-a1", "pass")) is None


def execution_of_marker(fake: azure.FakeAzure, marker: str) -> dict[str, Any]:
    [ex] = [e for e in fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == marker]
    return ex


def _find_or_none(provider: ContainerAppsProvider, spec: Any) -> ContainerAppsHandle | None:
    try:
        return provider.find(spec)
    except TransientProviderError:
        return None


# ---- an execution that runs on after its runner reported -------------------------------------------
@pytest.fixture
async def cp(fake: azure.FakeAzure, home: Path) -> AsyncIterator[tuple[ControlPlane, Agent]]:
    catalog(home, local_store=True)
    plane = ControlPlane(Settings(home=home, stop_confirm_timeout_s=4, **FAST))  # results in the local store
    async with Client(build_server(plane)) as client:
        yield plane, Agent(client)


async def _job_state(plane: ControlPlane, tid: str, want: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (state := plane.store.jobs.get(AttemptRef(tid, 1)).state) != want and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    return state


def _stops(fake: azure.FakeAzure, name: str) -> int:
    return sum(1 for _, m, p in fake.requests if m == "POST" and p.endswith(f"/executions/{name}/stop"))


async def test_an_execution_running_after_its_runner_reported_is_stopped_until_azure_says_it_ended(
        fake: azure.FakeAzure, cp: tuple[ControlPlane, Agent]) -> None:
    plane, agent = cp
    fake.linger = True  # the container exits, the execution goes on Running (and billing)
    tid = await agent.submit(inputs={"log_lines": 2})
    assert (await agent.wait(tid, timeout=60))["state"] == "succeeded"
    ex = execution_of(fake, tid)
    assert plane.store.jobs.get(AttemptRef(tid, 1)).state in ("draining", "done")
    assert await _job_state(plane, tid, "done") == "done"  # once Azure said it ended...
    assert execution_of(fake, tid)["status"] == "Stopped" and _stops(fake, ex["name"]) >= 1  # ...after a stop
    job = plane.store.jobs.get(AttemptRef(tid, 1))
    assert job.abandoned_at is None and (await agent.call("get_task_status", task_id=tid))["state"] == "succeeded"


async def test_an_execution_that_never_ends_after_its_runner_reported_is_abandoned(
        fake: azure.FakeAzure, cp: tuple[ControlPlane, Agent]) -> None:
    plane, agent = cp
    fake.linger = fake.ignore_stop = True
    tid = await agent.submit(inputs={})
    assert (await agent.wait(tid, timeout=60))["state"] == "succeeded"
    name = execution_of(fake, tid)["name"]
    began = time.monotonic()
    assert await _job_state(plane, tid, "abandoned") == "abandoned"
    assert time.monotonic() - began >= 2  # after the stop-confirm timeout (4 s) from its first stop
    assert execution_of(fake, tid)["status"] == "Running" and _stops(fake, name) >= 1  # stopped, to no avail
    shown = subprocess.run([sys.executable, "-m", "controlplane.cli", "jobs", "--state", "abandoned", "--json",
                            "--home", str(plane.settings.home)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["task_id"], row["provider_status"]) == (tid, "Running")
    assert (await agent.call("get_task_status", task_id=tid))["state"] == "succeeded"  # the outcome stands

    fake.finish(name)  # Azure says it ended at last: done, the record of its abandonment kept
    abandoned_at = plane.store.jobs.get(AttemptRef(tid, 1)).abandoned_at
    assert await _job_state(plane, tid, "done") == "done"
    assert plane.store.jobs.get(AttemptRef(tid, 1)).abandoned_at == abandoned_at
