"""The Azure Container Apps Jobs provider against the fake ARM and Log Analytics server
(`tests/azure.py`, HTTPS with a self-signed certificate on 127.0.0.1), driven by the real
azure-mgmt-appcontainers and azure-monitor-query clients, with the fake running each execution's
runner as a local process and results and artifacts in Azure Blob on azurite: the whole lifecycle
through the MCP tools, stop (and an execution that ignores it), the status table, the catalog's
cpu/memory check, a crash between intent and execution name, throttled APIs, the log quota, and
the provider contract suite."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
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
from controlplane_providers import ratelimit
from controlplane_providers.base import JobPhase
from controlplane_providers.container_apps import ContainerAppsHandle, ContainerAppsOptions, ContainerAppsProvider, kql
from tests import azure
from tests.cloud import CloudTarget, azure_target, azurite_server, run_without_callback, usage_of  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent
from tests.exactly_once import a_late_launch_runs_nothing, a_recorded_execution_refused_its_claim_is_left_for_the_holder
from tests.provider_contract import Harness, ProviderContract, still_watched

pytestmark = pytest.mark.anyio
RG, JOB, RUNNER = azure.RESOURCE_GROUP, azure.JOB, azure.RUNNER
ENDED = ("Succeeded", "Failed", "Stopped")


def settings_env(fake: azure.FakeAzure, **extra: str) -> dict[str, str]:
    return {"SUBSCRIPTION_ID": azure.SUBSCRIPTION, "ENDPOINT": fake.url, "LOGS_ENDPOINT": fake.url,
            "WORKSPACE_ID": azure.WORKSPACE, "CA_BUNDLE": fake.ca_file, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.2",
            "MAX_READS_PER_S": "500", "MAX_WRITES_PER_S": "500", "LOG_SETTLE_S": "0", "RETRY_BACKOFF_S": "0.02",
            **extra}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[azure.FakeAzure]:
    with azure.FakeAzure(seed=7) as fake:
        fake.create_job(RG, JOB, command=RUNNER, image="cp-runner:1")
        for k, v in settings_env(fake).items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()  # fresh limiters for this fake's endpoint
        yield fake


@pytest.fixture
def blob(azurite_server: str, monkeypatch: pytest.MonkeyPatch) -> CloudTarget:  # noqa: F811
    target = azure_target(azurite_server)
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)  # the runners (the fake's processes) inherit them, as a job its identity
    return target


def catalog(home: Path, *, job: str = JOB, retry: str = "{ max_attempts = 1 }", resources: str | None = None,
            options: str = "", local_store: bool = False) -> None:
    """The default catalog with `exercise` on Container Apps (the fake's job) in its own class.
    `local_store`: its jobs reach the control plane's local store (the fake runs them on this
    machine), declared on the placement, as an operator would declare a store it granted them."""
    from tests.cloud import exercise_catalog

    exercise_catalog(home, provider="container_apps", resource_class="aca", retry=retry,
                     options=f'resource_group = "{RG}", job = "{job}"{options}',
                     resources=resources or "max_concurrency = 4\nmax_queue_length = 100\ncpu = 0.5\nmemory_mb = 1024")
    if local_store:
        path = home / "catalog.toml"
        old = 'provider = "container_apps"\nresource_class = "aca"'
        assert old in path.read_text()
        path.write_text(path.read_text().replace(
            old, 'placements = [{ provider = "container_apps", reachable_stores = ["file://"] }]\nresource_class = "aca"'))


@dataclass
class Run:
    cp: ControlPlane
    agent: Agent
    fake: azure.FakeAzure


@pytest.fixture
async def run(fake: azure.FakeAzure, blob: CloudTarget, home: Path) -> AsyncIterator[Run]:
    catalog(home, retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, object_store_url=blob.url, stop_confirm_timeout_s=4, **FAST))
    async with Client(build_server(cp)) as client:
        yield Run(cp, Agent(client), fake)


def execution_of(fake: azure.FakeAzure, tid: str, attempt: int = 1, *, final: bool = False) -> dict[str, Any]:
    """The execution of a task attempt; with `final`, once it has ended (the task can end first:
    the runner reports before its process exits)."""
    name = f"cp-{tid.removeprefix('tsk_')}-a{attempt}"
    deadline = time.monotonic() + 30
    while True:
        [ex] = [e for e in fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == name]
        if not final or ex["status"] in ENDED or time.monotonic() > deadline:
            return ex
        time.sleep(0.05)


# ---- the lifecycle through the MCP tools ----------------------------------------------------------
async def test_lifecycle_through_the_mcp_tools(run: Run) -> None:
    agent = run.agent
    tid = await agent.submit(inputs={"progress_steps": 3, "sleep_s": 0.6, "log_lines": 30, "artifact_bytes": 50_000,
                                     "result": {"on": "container apps"}})
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded", st
    assert st["progress"]["percent"] == 100
    ex = execution_of(run.fake, tid, final=True)
    # The start carried the whole container: the job's image, the tool's command after the
    # image's entrypoint, the runner's env, and the resource class's shape.
    assert ex["status"] == "Succeeded" and ex["image"] == "cp-runner:1"
    assert ex["args"] == ["python", "-m", "controlplane_tools.exercise"] and not ex["command"]
    assert (ex["cpu"], ex["memory"]) == (0.5, "1Gi")
    assert ex["env"]["CONTROLPLANE_TASK_ID"] == tid and ex["env"]["CONTROLPLANE_STORE_URL"].startswith("az://")
    assert "CONTROLPLANE_CALLBACK_SECRET" not in ex["env"]
    assert st["log_link"].startswith("https://portal.azure.com/") and ex["name"] in st["log_link"]
    assert run.fake.tokens  # every ARM call carried a bearer token

    relayed = await agent.all_logs(tid)
    assert [ln["message"] for ln in relayed] == [f"line {i}" for i in range(30)]
    # The execution's console log in Log Analytics, page by page.
    seen = await agent.provider_log_messages(tid, limit=9)
    assert [m for m in seen if m.startswith("line ")] == [f"line {i}" for i in range(30)]

    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"]["on"] == "container apps"
    [art] = res["artifacts"]
    body = httpx.get(art["download_url"]).content  # a SAS URL that azurite checks
    assert len(body) == art["size_bytes"] == 50_000 and hashlib.sha256(body).hexdigest() == art["sha256"]


async def test_cancel_stops_the_execution(run: Run) -> None:
    tid = await run.agent.submit(inputs={"sleep_s": 120, "spawn_children": 1})
    await run.agent.wait(tid, {"running"}, timeout=60)
    proc = run.fake.processes[execution_of(run.fake, tid)["name"]]
    assert (await run.agent.call("cancel_task", task_id=tid, reason="enough"))["state"] == "cancel_requested"
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "cancelled" and st["error"]["code"] == "CANCELLED"
    assert execution_of(run.fake, tid, final=True)["status"] == "Stopped" and proc.poll() is not None
    deadline = time.monotonic() + 30  # done once a poll has seen it ended (the runner's report may come first)
    while run.cp.store.jobs.get(AttemptRef(tid, 1)).state != "done" and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    assert run.cp.store.jobs.get(AttemptRef(tid, 1)).state == "done" and run.cp.store.jobs.get(AttemptRef(tid, 1)).abandoned_at is None


async def test_an_execution_that_ignores_stop_is_abandoned_not_waited_on(run: Run) -> None:
    run.fake.ignore_stop = True  # microsoft/azure-container-apps#1071: stop answers 202, nothing happens
    tid = await run.agent.submit(inputs={"sleep_s": 120})
    await run.agent.wait(tid, {"running"}, timeout=60)
    # A hung container: its runner cannot hear the cancel through its heartbeat either.
    tree = psutil.Process(run.fake.processes[execution_of(run.fake, tid)["name"]].pid)
    tree = [tree, *tree.children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child listed, then gone
            p.suspend()
    began = time.monotonic()
    await run.agent.call("cancel_task", task_id=tid)
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "cancelled" and time.monotonic() - began >= 3.5  # after stop_confirm_timeout_s (4)
    ex = execution_of(run.fake, tid)
    assert ex["status"] == "Running"  # still running in the cloud, though asked to stop
    assert any(m == "POST" and p.endswith(f"/executions/{ex['name']}/stop") for _, m, p in run.fake.requests)
    job = run.cp.store.jobs.get(AttemptRef(tid, 1))
    assert job.state == "abandoned" and job.abandoned_at is not None
    trail = [e for e in run.cp.store.logs.events(tid) if e.kind == "cancelled"]
    assert trail[0].detail["job"] == "abandoned"

    # The operator sees it, with the cloud's own word for it.
    shown = subprocess.run([sys.executable, "-m", "controlplane.cli", "jobs", "--state", "abandoned", "--json",
                            "--home", str(run.cp.settings.home)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["task_id"], row["provider"], row["provider_status"]) == (tid, "container_apps", "Running")

    # Still watched: once Azure says it ended, it is done, and the record of its abandonment stays.
    run.fake.finish(ex["name"], exit_code=143)
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    deadline = time.monotonic() + 30
    while run.cp.store.jobs.get(AttemptRef(tid, 1)).state != "done" and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    assert run.cp.store.jobs.get(AttemptRef(tid, 1)).state == "done" and run.cp.store.jobs.get(AttemptRef(tid, 1)).abandoned_at == job.abandoned_at


async def test_timeout_stops_the_execution(run: Run) -> None:
    tid = await run.agent.submit(inputs={"sleep_s": 120}, resources={"max_runtime_s": 1})
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "timed_out" and st["error"]["code"] == "TOOL_TIMEOUT"
    assert execution_of(run.fake, tid, final=True)["status"] == "Stopped"


async def test_failed_tool_and_vanished_execution(run: Run) -> None:
    bad = await run.agent.submit(inputs={"exit_code": 3})
    st = await run.agent.wait(bad, timeout=60)
    assert st["state"] == "failed" and st["error"]["code"] == "TOOL_FAILED" and st["error"]["exit_code"] == 3

    tid = await run.agent.submit(inputs={"sleep_s": 2})
    await run.agent.wait(tid, {"running"}, timeout=60)
    run.fake.forget(execution_of(run.fake, tid)["name"])  # out of the job's limited history, process killed
    st = await run.agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded" and st["attempt"] == 2  # worker_lost, retried
    retry = [e for e in run.cp.store.logs.events(tid) if e.kind == "retry"]
    assert retry[0].detail["error"] == "WORKER_LOST"


async def test_a_smaller_task_gets_the_smallest_allowed_shape(run: Run) -> None:
    tid = await run.agent.submit(inputs={}, resources={"cpu": 0.3, "memory_mb": 300})
    assert (await run.agent.wait(tid, timeout=60))["state"] == "succeeded"
    ex = execution_of(run.fake, tid)
    assert (ex["cpu"], ex["memory"]) == (0.5, "1Gi")  # 0.3 vCPU rounds up to 0.5 with its 1 GiB


# ---- scratch disk: the shape's ephemeral storage -------------------------------------------------------
async def test_scratch_disk_picks_a_shape_whose_storage_covers_it(fake: azure.FakeAzure, blob: CloudTarget,
                                                                  home: Path) -> None:
    """Azure gives a replica 1 GiB of ephemeral storage at 0.25 vCPU, 2 at 0.5, 4 up to 1, 8 above:
    a task's scratch_mb is applied by the shape it starts with, within its class's 2 vCPU."""
    catalog(home, resources="max_concurrency = 4\nmax_queue_length = 100\ncpu = 2\nmemory_mb = 4096")
    cp = ControlPlane(Settings(home=home, object_store_url=blob.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        small = {"cpu": 0.25, "memory_mb": 512}
        plain = await agent.submit(inputs={}, resources=small)
        three = await agent.submit(inputs={}, resources={**small, "scratch_mb": 3000})
        eight = await agent.submit(inputs={}, resources={**small, "scratch_mb": 8192})
        for tid in (plain, three, eight):
            assert (await agent.wait(tid, timeout=60))["state"] == "succeeded"
        err = await agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 8193})
        assert err["code"] == "INVALID_REQUEST"
        assert err["message"] == (
            "resources.scratch_mb=8193 exceeds the 8192 MiB of scratch disk the container_apps provider guarantees "
            "for resource class 'aca': Azure Container Apps gives a replica ephemeral storage by its vCPUs (0.25 vCPU "
            "or less: 1 GiB, 0.5: 2 GiB, 1: 4 GiB, more: 8 GiB), and resource class 'aca' allows 2 vCPU: at most "
            "8192 MiB")
        assert len((await agent.call("list_tasks"))["tasks"]) == 3
    shapes = [(execution_of(fake, t)["cpu"], execution_of(fake, t)["memory"]) for t in (plain, three, eight)]
    assert shapes == [(0.25, "0.5Gi"), (0.75, "1.5Gi"), (1.25, "2.5Gi")]  # 1, 4 and 8 GiB of storage
    assert len(fake.executions()) == 3  # the refused one started nothing


async def test_a_class_scratch_cap_limits_below_what_the_shape_has(fake: azure.FakeAzure, blob: CloudTarget,
                                                                    home: Path) -> None:
    catalog(home, resources="max_concurrency = 4\nmax_queue_length = 100\ncpu = 2\nmemory_mb = 4096\nscratch_mb = 3000")
    cp = ControlPlane(Settings(home=home, object_store_url=blob.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        err = await agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 3001})
        assert err == {"code": "INVALID_REQUEST", "message": "resources.scratch_mb=3001 exceeds resource class 'aca' "
                                                             "limit of 3000"}
        tid = await agent.submit(inputs={}, resources={"cpu": 0.25, "memory_mb": 512, "scratch_mb": 3000})
        assert (await agent.wait(tid, timeout=60))["state"] == "succeeded"
    assert (execution_of(fake, tid)["cpu"], execution_of(fake, tid)["memory"]) == (0.75, "1.5Gi")
    assert len(fake.executions()) == 1


async def test_scratch_disk_beyond_the_class_shape_or_on_a_dedicated_profile_is_refused(run: Run) -> None:
    err = await run.agent.error("submit_task", tool_name="exercise", resources={"scratch_mb": 2049})
    assert err["code"] == "INVALID_REQUEST" and "resource class 'aca' allows 0.5 vCPU: at most 2048 MiB" in err["message"]
    tid = await run.agent.submit(inputs={}, resources={"scratch_mb": 2048})  # what 0.5 vCPU has
    assert (await run.agent.wait(tid, timeout=60))["state"] == "succeeded"
    assert (execution_of(run.fake, tid)["cpu"], execution_of(run.fake, tid)["memory"]) == (0.5, "1Gi")
    provider: ContainerAppsProvider = run.cp.providers["container_apps"]
    from controlplane_providers.base import Shape

    dedicated = Shape("aca", 4, 16384, 0, ContainerAppsOptions(resource_group=RG, job=JOB, workload_profile="d4"))
    assert provider.scratch_limit_mb(dedicated) is None
    assert "dedicated workload profile 'd4'" in provider.scratch_note(dedicated)


async def test_usage_of_an_attempt_azure_ended_is_the_executions_own_record(fake: azure.FakeAzure,
                                                                             blob: CloudTarget, home: Path) -> None:
    """A runner that cannot reach the control plane leaves its events in the object store; the
    attempt ends when Azure reports the execution ended, and what it used is counted from the
    execution's startTime and endTime, times the class's shape (0.5 vCPU, 1 GiB), at the prices
    of the region its catalog entry names."""
    catalog(home, options=', region = "eastus"')
    st = await run_without_callback(home, blob.url, {"sleep_s": 1.0})
    props = fake.execution_json(execution_of(fake, st["task_id"], final=True)["name"])["properties"]
    ran_s = (datetime.fromisoformat(props["endTime"]) - datetime.fromisoformat(props["startTime"])).total_seconds()
    assert ran_s >= 1.0 and st["usage"] == usage_of(ran_s, 0.5, 1)
    # The Consumption plan's active-usage list prices in East US, per second.
    assert st["estimated_cost"]["amount"] == pytest.approx(ran_s * (0.000024 / 2 + 0.000003), abs=2e-6)


async def test_a_wrong_job_name_fails_the_launch_clearly(fake: azure.FakeAzure, blob: CloudTarget, home: Path) -> None:
    catalog(home, job="no-such-job")
    cp = ControlPlane(Settings(home=home, object_store_url=blob.url, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        st = await agent.wait(await agent.submit(inputs={}), timeout=30)
    assert st["state"] == "failed" and st["error"]["code"] == "LAUNCH_FAILED"
    assert "resourceGroups/cp-rg/providers/Microsoft.App/jobs/no-such-job does not exist" in st["error"]["message"]


@pytest.mark.parametrize(("resources", "options", "message"), [
    ("cpu = 1\nmemory_mb = 1024", "", "allows cpu 0.25 to 4 in steps of 0.25 with 2 GiB per vCPU (e.g. cpu 1 with "
                                      "memory_mb 2048)"),
    ("cpu = 0.3\nmemory_mb = 614", "", "asks cpu 0.3 with memory_mb 614"),
    ("cpu = 8\nmemory_mb = 16384", "", "allows cpu 0.25 to 4"),
    ("cpu = 1\nmemory_mb = 2048\ngpu = 1", "", "a GPU needs a GPU workload profile"),
])
def test_the_catalog_refuses_shapes_azure_does_not_offer(home: Path, resources: str, options: str, message: str) -> None:
    from controlplane.catalog import Catalog, CatalogError

    catalog(home, resources=f"max_concurrency = 4\n{resources}", options=options)
    with pytest.raises(CatalogError) as err:
        Catalog.parse((home / "catalog.toml").read_text(), source="catalog.toml")
    assert str(err.value).startswith("catalog.toml: tools.exercise.provider_options.workload_profile: ")
    assert message in str(err.value) and "(from resource_classes.aca.provider_options)" not in str(err.value)


def test_the_catalog_takes_allowed_shapes_and_dedicated_profiles(home: Path) -> None:
    from controlplane.catalog import Catalog, CatalogError

    for resources, options in (("cpu = 2\nmemory_mb = 4096", ""), ("cpu = 0.25\nmemory_mb = 512", ""),
                               ("cpu = 6\nmemory_mb = 30000\ngpu = 1", ', workload_profile = "gpu-a100"')):
        catalog(home, resources=f"max_concurrency = 4\n{resources}", options=options)
        Catalog.parse((home / "catalog.toml").read_text(), source="catalog.toml")
    catalog(home)  # and a short job name needs its resource group
    text = (home / "catalog.toml").read_text().replace(f'resource_group = "{RG}", ', "")
    with pytest.raises(CatalogError, match="resource_group: .*required with a short job name"):
        Catalog.parse(text, source="catalog.toml")


# ---- handles stored by earlier versions ------------------------------------------------------------
# jobs.handle_json exactly as the code before typed handles wrote it (workspace_id null when neither
# the catalog nor the settings named one).
OLD_ACA_HANDLES = [
    '{"execution": "cp-tools-k2x9q1", "job": "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/cp-rg'
    '/providers/Microsoft.App/jobs/cp-tools", "job_name": "cp-01jf3kq8-a1", "created_at": 1764201345.27, '
    '"workspace_id": "9a0c5b3e-0000-4000-8000-000000000002", "stuck_after_s": 900.0, "on_stuck": "wait"}',
    '{"execution": "cp-tools-k2x9q2", "job": "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/cp-rg'
    '/providers/Microsoft.App/jobs/cp-tools", "job_name": "cp-01jf3kq8-a2", "created_at": 1764201345.27, '
    '"workspace_id": null, "stuck_after_s": 60.0, "on_stuck": "fail"}',
]


@pytest.mark.parametrize("stored", OLD_ACA_HANDLES)
def test_handles_stored_by_earlier_versions_decode_unchanged(stored: str, fake: azure.FakeAzure, tmp_path: Path) -> None:
    provider = ContainerAppsProvider.configured(tmp_path)
    handle = provider.handle(json.loads(stored))
    assert isinstance(handle, ContainerAppsHandle) and provider.poll_key(handle).endswith("/jobs/cp-tools")
    assert json.dumps(handle.encode()) == stored


def test_an_execution_started_by_an_earlier_version_is_still_watched(fake: azure.FakeAzure, tmp_path: Path) -> None:
    def earlier(launched: ContainerAppsHandle) -> dict[str, Any]:  # what the earlier launch returned for it
        return {"execution": launched.execution, "job": launched.job, "job_name": "cp-old-a1",
                "created_at": launched.created_at, "workspace_id": azure.WORKSPACE, "stuck_after_s": 900.0,
                "on_stuck": "wait"}

    restarted = ContainerAppsProvider.configured(tmp_path, poll_interval_s=0.1)
    handle, st = still_watched(ContainerAppsHarness(tmp_path, fake), restarted, earlier)
    assert restarted.log_link(handle).endswith(f"/executions/{handle.execution}")
    assert st.raw_status == "Stopped"


# ---- restart between intent and execution name ----------------------------------------------------
async def test_crash_after_start_before_the_handle_launches_exactly_one_execution(fake: azure.FakeAzure,
                                                                               blob: CloudTarget, home: Path) -> None:
    from controlplane import api

    catalog(home)
    settings = Settings(home=home, object_store_url=blob.url, **FAST)
    first = ControlPlane(settings)
    tid = first.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"log_lines": 3}))["task_id"]
    [claimed] = first.store.jobs.claim_for_launch("aca", 4)  # the launch intent, committed
    task, job = claimed
    first.scheduler._write_inputs(task)
    first.providers["container_apps"].launch(first.build_spec(task, job))  # the start went through...
    del first  # ...and the control plane died before recording the execution's name

    second = ControlPlane(settings)
    assert second.store.jobs.get(AttemptRef(tid, 1)).state == "launching"
    async with Client(build_server(second)) as client:
        st = await Agent(client).wait(tid, timeout=60)
    assert st["state"] == "succeeded"
    assert fake.runs[job.job_name] == 1  # found by its marker, not started again
    assert json.loads(second.store.jobs.get(AttemptRef(tid, 1)).handle_json)["execution"] == execution_of(fake, tid)["name"]


# ---- throttling -----------------------------------------------------------------------------------
async def test_throttled_apis_fail_no_task_and_run_nothing_twice(fake: azure.FakeAzure, blob: CloudTarget,
                                                                 home: Path) -> None:
    catalog(home)
    cp = ControlPlane(Settings(home=home, object_store_url=blob.url, **FAST))
    fake.fault_rate = 0.3  # 429 + Retry-After to a third of all ARM and Log Analytics requests
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
    # Every HTTP try, the retried ones too, held a place in the shared ARM limiters.
    held = sum(lim.calls for name, lim in ratelimit._registry.items() if name.startswith("arm-"))
    arm = [r for r in fake.requests if "/providers/Microsoft.App/" in r[2]]
    assert held == len(arm)


def test_arm_reads_and_writes_keep_to_their_rates(fake: azure.FakeAzure, tmp_path: Path) -> None:
    provider = ContainerAppsProvider.configured(tmp_path, max_reads_per_s=5, max_writes_per_s=2)
    opts = ContainerAppsOptions(resource_group=RG, job=JOB)
    names = fake.add_executions(RG, JOB, 3, status="Running")
    job_id = opts.job_id(azure.SUBSCRIPTION)
    handles = [ContainerAppsHandle(execution=n, job=job_id, job_name=n, created_at=time.time()) for n in names]
    fake.reset_counts()
    began = time.monotonic()
    for _ in range(12):
        provider.poll(handles)  # one list (a read) each
    for h in handles * 2:
        provider.cancel(h)  # a stop (a write) each
    took = time.monotonic() - began
    reads = [t for t, method, _ in fake.requests if method == "GET"]
    writes = [t for t, method, _ in fake.requests if method == "POST"]
    assert len(reads) == 12 and len(writes) == 6
    for times, rate in ((reads, 5), (writes, 2)):  # no one-second window holds more than the rate
        assert all(sum(1 for u in times if t <= u < t + 1.0) <= rate for t in times)
    assert took >= 2.0  # 12 reads at 5/s need more than two seconds


async def test_log_reads_keep_to_the_quota_and_share_pages(run: Run) -> None:
    tid = await run.agent.submit(inputs={"log_lines": 5})
    assert (await run.agent.wait(tid, timeout=60))["state"] == "succeeded"
    provider: ContainerAppsProvider = run.cp.providers["container_apps"]
    provider.settings = provider.settings.model_copy(update={"log_queries_per_min": 3})
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
    assert len(run.fake.queries) == 1  # one query served them all
    assert all([ln["message"] for ln in p["lines"] if ln["message"].startswith("line ")] ==
               [f"line {i}" for i in range(5)] for p in pages)
    answers = [await tail(limit) for limit in (49, 48, 47)]  # other pages: each query takes a place
    assert "limited to 3 a minute" in answers[-1]["reason"] and answers[-1]["lines"] == []
    assert len(run.fake.queries) == 3  # quota of 3, never exceeded


def test_log_rows_at_one_instant_are_each_read_once(fake: azure.FakeAzure, tmp_path: Path) -> None:
    """Rows that share a TimeGenerated (to the 100 ns) straddle page ends: none lost, none twice."""
    provider = ContainerAppsProvider.configured(tmp_path)
    [name] = fake.add_executions(RG, JOB, 1, status="Running")
    instant = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 30))
    for i in range(7):
        fake.add_log(RG, JOB, name, f"same {i}", ts=f"{instant}.1234567Z")
    fake.add_log(RG, JOB, name, "after", ts=f"{instant}.1234568Z")  # one tick (100 ns) later
    handle = ContainerAppsHandle(execution=name, job=ContainerAppsOptions(resource_group=RG, job=JOB).job_id(
        azure.SUBSCRIPTION), job_name=name, created_at=time.time() - 60, workspace_id=azure.WORKSPACE)
    seen, cursor = [], None
    for _ in range(10):
        page = provider._read_logs(handle, cursor, 3)
        if not page.lines:
            break
        seen += [ln.message for ln in page.lines]
        cursor = page.next_cursor
    assert sorted(seen[:7]) == [f"same {i}" for i in range(7)] and seen[7:] == ["after"]
    assert len(cursor.split("|")[0].rsplit(".", 1)[1]) == 8  # the service's 7 digits and Z, kept as text


def test_the_query_is_the_documented_shape() -> None:
    from datetime import UTC, datetime

    q = kql("cp-exercise", "cp-exercise-ab12cde", "2026-11-23T10:00:00.1234567Z|itm'1", datetime(2026, 11, 23, 10, 5,
                                                                                                 tzinfo=UTC), 60)
    assert q.splitlines()[0] == "ContainerAppConsoleLogs_CL"
    assert "ContainerGroupName_s startswith 'cp-exercise-ab12cde-'" in q  # the execution's replicas
    # The (time, _ItemId) tiebreak is in the query: rows after the cursor, any number at one instant.
    assert ("TimeGenerated > datetime(2026-11-23T10:00:00.1234567Z) or (TimeGenerated == "
            "datetime(2026-11-23T10:00:00.1234567Z) and strcmp(_ItemId, 'itm\\'1') > 0)") in q
    assert "TimeGenerated <= datetime(2026-11-23T10:05:00.0000000Z)" in q and "| take 60" in q
    monitor = kql("cp-exercise", "cp-exercise-ab12cde", None, datetime(2026, 11, 23, 10, 5, tzinfo=UTC), 60,
                  "ContainerAppConsoleLogs")
    assert monitor.splitlines()[:2] == ["ContainerAppConsoleLogs", "| where ContainerGroupName startswith "
                                                                   "'cp-exercise-ab12cde-'"]
    assert monitor.splitlines()[-1] == "| project t, _ItemId, Log, Stream"


# ---- the status table -------------------------------------------------------------------------------
def test_every_execution_status_maps_onto_a_phase(fake: azure.FakeAzure, tmp_path: Path) -> None:
    provider = ContainerAppsProvider.configured(tmp_path, stuck_after_s=60)
    job_id = ContainerAppsOptions(resource_group=RG, job=JOB).job_id(azure.SUBSCRIPTION)
    [processing] = fake.add_executions(RG, JOB, 1, status="Processing")
    running, degraded, unknown, ok, failed, stopped = fake.add_executions(RG, JOB, 6, status="Running")
    fake.set_status(degraded, "Degraded")
    fake.set_status(unknown, "Unknown")
    fake.finish(ok, exit_code=0)
    fake.finish(failed, exit_code=3)
    provider.cancel(ContainerAppsHandle(execution=stopped, job=job_id, job_name=stopped))
    deadline = time.monotonic() + 10
    while fake.execution_json(stopped)["properties"]["status"] != "Stopped" and time.monotonic() < deadline:
        time.sleep(0.05)
    names = [processing, running, degraded, unknown, ok, failed, stopped]
    old = time.time() - 3600
    statuses = provider.poll([ContainerAppsHandle(execution=n, job=job_id, job_name=n, created_at=old, on_stuck="fail")
                              for n in names]
                             + [ContainerAppsHandle(execution="cp-exercise-gone000", job=job_id, job_name="gone",
                                                    created_at=old)])
    assert [(s.phase, s.raw_status) for s in statuses] == [
        (JobPhase.PENDING, "Processing"), (JobPhase.RUNNING, "Running"), (JobPhase.RUNNING, "Degraded"),
        (JobPhase.PENDING, "Unknown"), (JobPhase.SUCCEEDED, "Succeeded"), (JobPhase.FAILED, "Failed"),
        (JobPhase.FAILED, "Stopped"), (JobPhase.GONE, "GONE")]
    assert statuses[0].waiting_reason.startswith("Processing for 60 min") and statuses[0].give_up_reason
    assert statuses[4].finished_at is not None and statuses[1].started_at is not None


# ---- the provider contract suite --------------------------------------------------------------------
class ContainerAppsHarness(Harness):
    log_quota_setting = "log_queries_per_min"

    def __init__(self, home: Path, fake: azure.FakeAzure):
        self.fake = self.capacity = self.faults = fake  # start_jobs, fault_rate
        fake.create_job(RG, "contract", command=RUNNER)
        fake.create_job(RG, "contract-b", command=RUNNER)
        self.provider = ContainerAppsProvider.configured(home, poll_interval_s=0.1)
        self.options = ContainerAppsOptions(resource_group=RG, job="contract")
        self._n = 0

    def spec(self, job_name: str, script: str, **kw: Any) -> Any:
        # Alternate between two jobs so that one poll spans several poll groups.
        self._n += 1
        spec = super().spec(job_name, script, **kw)
        job = "contract" if self._n % 2 else "contract-b"
        return replace(spec, options=ContainerAppsOptions(resource_group=RG, job=job))

    def count_jobs(self, job_name: str) -> int:
        return sum(1 for e in self.fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == job_name)

    def forget(self, handle: ContainerAppsHandle) -> None:
        self.fake.forget(handle.execution)

    def log_reads(self) -> int:
        return len(self.fake.queries)


class TestContainerAppsContract(ProviderContract):
    @pytest.fixture
    def harness(self, fake: azure.FakeAzure, tmp_path: Path) -> ContainerAppsHarness:
        return ContainerAppsHarness(tmp_path, fake)


async def test_a_late_second_launch_of_an_attempt_runs_nothing(run: Run) -> None:
    """A leader paused past its lease starts the Container Apps job again for an attempt its
    successor already started: the second execution's runner is refused the claim and runs nothing."""
    await a_late_launch_runs_nothing(run.cp, run.agent)


async def test_a_recorded_execution_refused_its_claim_leaves_the_attempt_to_the_holder(run: Run) -> None:
    """The late launch claimed first: the job follows the execution that holds the claim."""
    await a_recorded_execution_refused_its_claim_is_left_for_the_holder(run.cp, run.agent)
