"""A sweep on the Cloud Run fake (`tests/gcp.py`, the real google-cloud-run client over REST, each
execution the runner as a local process, results in GCS on its emulator) under 429 storms: every
shard succeeds with its own result read back through the control plane, each started exactly once
(the fake's processes counted per job name), and no second holds more Admin API requests than the
provider's rate limit (`MAX_TPS`).

250 shards by default, what fits the suite's time on two cores; `CONTROLPLANE_TEST_SWEEP_SHARDS=1000`
runs the thousand of the sweeps' design. To afford them, the fake forks each execution's runner
from a preloaded interpreter (`tests/forkserver.py`) rather than starting Python anew, and the
tool is a shell command that returns its inputs as its result."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from tests import gcp
from tests.cloud import CloudTarget, gcs_server, gcs_target  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent
from tests.forkserver import ForkServer
from tests.sweeping import run_sweep

pytestmark = pytest.mark.anyio
SHARDS = int(os.environ.get("CONTROLPLANE_TEST_SWEEP_SHARDS", "250"))
ECHO = ("sh", "-c", 'cp "$CONTROLPLANE_INPUTS_FILE" "$CONTROLPLANE_RESULT_FILE"')  # the result: the inputs
MAX_TPS = 40


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[gcp.FakeCloudRun]:
    with ForkServer(preload=["controlplane_runner.runner", "controlplane.objectstore.gcs"]) as forks, \
            gcp.FakeCloudRun(seed=11, pending_s=0.01) as fake:  # the fake reaps its processes first
        fake.spawn = forks.start  # each execution's runner forked, not a new interpreter
        fake.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER,
                        args=["python", "-m", "controlplane_tools.exercise"])
        for k, v in {"ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.5",
                     "MAX_TPS": str(MAX_TPS), "RETRY_DEADLINE_S": "30", "LIST_LAG_S": "1"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        ratelimit._registry.clear()  # fresh limiters for this fake's endpoint
        yield fake


@pytest.fixture
def gcs(gcs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CloudTarget:  # noqa: F811
    target = gcs_target(gcs_server, tmp_path)
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)
    return target


def busiest_second(times: list[float]) -> int:
    """The most requests any one-second window held."""
    window: deque[float] = deque()
    most = 0
    for t in sorted(times):
        window.append(t)
        while window[0] <= t - 1.0:
            window.popleft()
        most = max(most, len(window))
    return most


@pytest.mark.sqlite_only("the launch path under throttling, not the engine (the engines run the sweep tests)")
@pytest.mark.timeout(max(300, 240 + SHARDS))  # the size is a setting
async def test_a_sweep_of_hundreds_of_shards_under_429_storms_runs_each_shard_once(
        fake: gcp.FakeCloudRun, gcs: CloudTarget, home: Path) -> None:
    from tests.cloud import exercise_catalog

    exercise_catalog(home, provider="cloud_run", resource_class="cloudrun",
                     options=f'project = "{gcp.PROJECT}", region = "{gcp.REGION}", job = "{gcp.JOB}"',
                     resources=f"max_concurrency = 64\nmax_queue_length = {max(SHARDS, 100)}\ncpu = 1\nmemory_mb = 512",
                     command=ECHO)
    cp = ControlPlane(Settings(home=home, object_store_url=gcs.url, **FAST))
    fake.rate_refusals = 30  # a storm of RATE_LIMIT_EXCEEDED on RunJob at the start
    fake.fault_rate = 0.05  # and 429 or 503 to one request in twenty throughout
    storms = 1

    def storm(st: dict[str, Any]) -> None:
        nonlocal storms
        if storms < 3 and fake.rate_refusals == 0 and st["counts"].get("succeeded", 0) > storms * SHARDS // 3:
            fake.rate_refusals, storms = 20, storms + 1  # another storm while shards run

    async with Client(build_server(cp)) as client:
        ran = await run_sweep(Agent(client), cp, SHARDS, storm, 120 + SHARDS)
    st, shards, results, took = ran.status, ran.tasks, ran.results, ran.took
    print(f"{SHARDS} shards on the Cloud Run fake in {took:.1f} s; {fake.faults} injected faults")
    assert st["counts"] == {"succeeded": SHARDS}, st
    assert {t.attempt for t in shards} == {1}
    assert [r["result"]["result"] for r in results] == [{"i": i} for i in range(SHARDS)]  # each shard's own
    names = {f"cp-{t.task_id.removeprefix('tsk_')}-a1" for t in shards}
    assert set(fake.runs) == names and set(fake.runs.values()) == {1}  # every shard run, and once
    admin_api = [t for t, _method, path in fake.requests if path.startswith("/v2/projects/")]
    print(f"{len(admin_api)} Admin API requests, {sum(p.endswith(':run') for _, _, p in fake.requests)} RunJob, "
          f"busiest second {busiest_second(admin_api)}")
    assert busiest_second(admin_api) <= MAX_TPS
    assert sum(p.endswith(":run") for _, _, p in fake.requests) >= SHARDS + 30 + 2 * 20  # the storms were met
