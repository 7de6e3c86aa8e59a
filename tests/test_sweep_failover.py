"""A placement going down in the middle of a sweep: the tool is placed on Cloud Run first
(`tests/gcp.py`), then on Container Apps (`tests/azure.py`), both wire-level fakes driven by the
real SDKs. Once part of the sweep has run, Cloud Run goes down, one of two ways:

- it refuses every launch for an allocation quota (the capacity signal its provider maps): every
  shard still succeeds, those refused there move to Container Apps and run there, the moves spend
  no retry budget, each is on the shard's status and in `controlplane_moves_total`, and the
  breaker of the refusing site is open;
- its API fails every request for a few seconds: the launches and polls that fail open the
  site's breaker, so the shards claimed meanwhile go to Container Apps at their first attempt,
  and those already placed on Cloud Run wait for it (a passing failure moves nothing) and run
  there once it answers again.

Either way no job name runs twice across the two fakes and no shard spends retry budget.

Both fakes fork each execution's runner from a preloaded interpreter (`tests/forkserver.py`);
the tool is a shell command that returns its inputs as its result; the store is the control
plane's local directory, which the fakes' jobs on this host reach (`reachable_stores`). 500 shards;
`CONTROLPLANE_TEST_FAILOVER_SHARDS` sets another size."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.catalog import default_catalog_text
from controlplane.mcp.server import build_server
from controlplane.ops import metrics
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from tests import azure, gcp
from tests.conftest import FAST, Agent
from tests.forkserver import ForkServer
from tests.sweeping import run_sweep
from tests.test_container_apps import settings_env

pytestmark = pytest.mark.anyio
pytest.importorskip("google.cloud.run_v2")

SHARDS = int(os.environ.get("CONTROLPLANE_TEST_FAILOVER_SHARDS", "500"))
EXERCISE = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
ECHO = 'command = ["sh", "-c", "cp \\"$CONTROLPLANE_INPUTS_FILE\\" \\"$CONTROLPLANE_RESULT_FILE\\""]'
SITE = f"cloud_run/{gcp.REGION}"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[gcp.FakeCloudRun, azure.FakeAzure]]:
    with ForkServer(preload=["controlplane_runner.runner"]) as forks, \
            gcp.FakeCloudRun(seed=3, pending_s=0.01) as run, azure.FakeAzure(seed=4, pending_s=0.01) as apps:
        run.spawn = apps.spawn = forks.start
        run.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER)
        apps.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in {"ENDPOINT": run.url, "LOGGING_ENDPOINT": run.url, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.5",
                     "MAX_TPS": "200", "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "1"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        for k, v in settings_env(apps, POLL_INTERVAL_S="0.5").items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()
        yield run, apps


def catalog(home: Path) -> None:
    """The default catalog with `exercise` on Cloud Run, then Container Apps, in a class of its own."""
    text = default_catalog_text()
    assert EXERCISE in text
    run = (f'{{ provider = "cloud_run", options = {{ project = "{gcp.PROJECT}", region = "{gcp.REGION}", '
           f'job = "{gcp.JOB}" }}, reachable_stores = ["file://"] }}')
    apps = (f'{{ provider = "container_apps", options = {{ resource_group = "{azure.RESOURCE_GROUP}", '
            f'job = "{azure.JOB}" }}, reachable_stores = ["file://"] }}')
    text = text.replace(EXERCISE, f'placements = [{run}, {apps}]\nresource_class = "failover"\n{ECHO}')
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(
        text + f"\n[resource_classes.failover]\nmax_concurrency = 48\nmax_queue_length = {max(SHARDS, 100)}\n"
               "cpu = 0.5\nmemory_mb = 1024\n")


def moves_counted() -> float:
    return metrics.MOVES.labels("exercise", "0", "cloud_run", "refused")._value.get()


@pytest.mark.sqlite_only("the choice of placement under a failing site, not the engine")
@pytest.mark.parametrize("down", ["capacity", "api"])
async def test_a_placement_down_mid_sweep_sends_the_rest_elsewhere_each_shard_once_no_budget_spent(
        fakes: tuple[gcp.FakeCloudRun, azure.FakeAzure], home: Path, down: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, apps = fakes
    if down == "api":
        monkeypatch.setenv("CONTROLPLANE_CLOUD_RUN_RETRY_DEADLINE_S", "1")  # a failing call gives up soon
    catalog(home)
    cp = ControlPlane(Settings(home=home, **{**FAST, "placement_breaker_failures": 3,
                                             "placement_breaker_cooldown_s": 600}))
    before = moves_counted()
    down_at: float | None = None
    opened = False

    def go_down(st: dict[str, Any]) -> None:
        nonlocal down_at, opened
        if down_at is None and st["counts"].get("succeeded", 0) >= SHARDS // 5:
            down_at = time.monotonic()
            if down == "capacity":
                run.quota_refusals = 10**9  # Cloud Run is out of room from now on
            else:
                run.fault_rate = 1.0  # every request answered 429 or 503
        if down == "api" and down_at is not None and time.monotonic() - down_at > 5:
            run.fault_rate = 0.0  # back
        opened = opened or cp.breakers.states().get(SITE) == "open"

    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        ran = await run_sweep(agent, cp, SHARDS, go_down, 120 + SHARDS)
        st, results, tasks, took = ran.status, ran.results, ran.tasks, ran.took
        moved = [t for t in tasks if t.attempt > 1]
        status = await agent.call("get_task_status", task_id=moved[0].task_id) if moved else {}
    assert down_at is not None
    ran_on_run, ran_on_apps = sum(run.runs.values()), sum(apps.runs.values())
    print(f"{SHARDS} shards in {took:.1f} s; {ran_on_run} ran on Cloud Run, {ran_on_apps} on Container Apps, "
          f"{len(moved)} moved")
    assert st["counts"] == {"succeeded": SHARDS}, st
    assert [r["result"]["result"] for r in results] == [{"i": i} for i in range(SHARDS)]  # each shard's own

    # each shard ran once, in all: the job of its last attempt, on one fake or the other
    assert set(run.runs.values()) <= {1} and set(apps.runs.values()) <= {1}
    assert not run.runs.keys() & apps.runs.keys()
    assert run.runs.keys() | apps.runs.keys() == {f"cp-{t.task_id.removeprefix('tsk_')}-a{t.attempt}" for t in tasks}
    assert ran_on_run >= SHARDS // 5 and ran_on_apps > 0 and opened
    assert {k.rsplit("-", 1)[1] for k in run.runs} == {"a1"}  # nothing went back to Cloud Run
    assert {(t.failures, t.recoveries) for t in tasks} == {(0, 0)}  # no retry budget spent
    if down == "api":  # nothing moved: new claims went round the open breaker
        assert moved == [] and moves_counted() == before
        return

    # the moves are what the agent and the operator see
    assert len(moved) > 0
    assert {t.attempt for t in moved} == {2}  # one move each: the breaker sent the rest straight on
    assert ran_on_apps == len(moved) + sum(1 for t in tasks if t.attempt == 1 and
                                           f"cp-{t.task_id.removeprefix('tsk_')}-a1" in apps.runs)
    [move] = status["moves"]
    assert (status["provider"], status["placement"], move["placement"], move["provider"]) == \
        ("container_apps", 1, 0, "cloud_run")
    assert moves_counted() == before + len(moved)
    assert cp.breakers.states()[SITE] == "open"
