"""Inputs by reference with jobs on the Cloud Run fake (the store on the GCS emulator) and on the
Container Apps fake (the store on azurite): an upload sent by its plan and then an artifact of the
task that read it reach each job as local files its runner fetched, through the job's own
identity (this host's emulator variables, inherited as a job inherits its identity) or with no
credential at all (`CONTROLPLANE_JOB_STORE_ACCESS=grants`: every cloud variable hidden from the
job, each file read through a GET the control plane signs)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane_providers import ratelimit
from tests import azure, gcp
from tests.cloud import CloudTarget, azure_target, azurite_server, exercise_catalog, gcs_server, gcs_target  # noqa: F401
from tests.conftest import FAST, Agent
from tests.fakehttp import FakeCloud
from tests.test_job_grants import CLOUD_VARS
from tests.test_references import DIGEST, result

pytestmark = pytest.mark.anyio


def on(provider: str, resource_class: str) -> str:
    """The digest tool moved to a provider's resource class."""
    return DIGEST.replace('provider = "local"\nresource_class = "cpu_small"',
                          f'provider = "{provider}"\nresource_class = "{resource_class}"')


@pytest.fixture
def cloud_run(gcs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeCloud, CloudTarget]]:  # noqa: F811
    target = gcs_target(gcs_server, tmp_path)
    with gcp.FakeCloudRun(seed=3) as fake:
        fake.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER)
        for k, v in {**target.env, "CONTROLPLANE_CLOUD_RUN_ENDPOINT": fake.url,
                     "CONTROLPLANE_CLOUD_RUN_LOGGING_ENDPOINT": fake.url, "CONTROLPLANE_CLOUD_RUN_ANONYMOUS": "1",
                     "CONTROLPLANE_CLOUD_RUN_POLL_INTERVAL_S": "0.2", "CONTROLPLANE_CLOUD_RUN_MAX_TPS": "500"}.items():
            monkeypatch.setenv(k, v)
        ratelimit._registry.clear()
        gcp.cloud_run_catalog(tmp_path / "home")
        yield fake, target


@pytest.fixture
def container_apps(azurite_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeCloud, CloudTarget]]:  # noqa: F811
    target = azure_target(azurite_server)
    with azure.FakeAzure(seed=3) as fake:
        fake.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in {"SUBSCRIPTION_ID": azure.SUBSCRIPTION, "ENDPOINT": fake.url, "LOGS_ENDPOINT": fake.url,
                     "WORKSPACE_ID": azure.WORKSPACE, "CA_BUNDLE": fake.ca_file, "ANONYMOUS": "1",
                     "POLL_INTERVAL_S": "0.2", "MAX_READS_PER_S": "500", "MAX_WRITES_PER_S": "500",
                     "LOG_SETTLE_S": "0", "RETRY_BACKOFF_S": "0.02"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        for k, v in target.env.items():
            monkeypatch.setenv(k, v)
        ratelimit._registry.clear()
        exercise_catalog(tmp_path / "home", provider="container_apps", resource_class="aca",
                         options=f'resource_group = "{azure.RESOURCE_GROUP}", job = "{azure.JOB}"',
                         resources="max_concurrency = 4\nmax_queue_length = 100\ncpu = 0.5\nmemory_mb = 1024")
        yield fake, target


@asynccontextmanager
async def plane(home: Path, target: CloudTarget, access: str) -> AsyncIterator[Agent]:
    cp = ControlPlane(Settings(home=home, object_store_url=target.url, job_store_access=access, **FAST))
    async with Client(build_server(cp)) as client:
        yield Agent(client)


@pytest.mark.parametrize("access", ["identity", "grants"])
@pytest.mark.parametrize("where", ["cloud_run", "container_apps"])
async def test_an_upload_and_an_artifact_reach_a_cloud_job(where: str, access: str, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    fake, target = request.getfixturevalue(where)
    home = tmp_path / "home"
    catalog = home / "catalog.toml"
    catalog.write_text(catalog.read_text() + on(where, "cloudrun" if where == "cloud_run" else "aca"))
    if access == "grants":
        fake.hidden_env = CLOUD_VARS  # the job's process has no way to the store but the grants
    body = hashlib.sha256(where.encode()).digest() * 2048  # 64 KiB
    async with plane(home, target, access) as agent:
        up = await agent.call("create_upload", name="in.bin", size_bytes=len(body),
                              sha256=hashlib.sha256(body).hexdigest())
        async with httpx.AsyncClient() as h:
            r = await h.put(up["plan"]["url"], content=body, headers=up["plan"].get("headers") or {})
            assert r.status_code in (200, 201), r.text
        await agent.call("complete_upload", upload_id=up["upload_id"])
        first = await agent.submit("digest", inputs={"data": up["reference"], "suffix": "+"})
        second = await agent.submit("digest", inputs={"data": f"artifact://{first}/out.bin"}, after=[first])
        got = await result(agent, first)
        assert got == {"size_bytes": len(body), "sha256": hashlib.sha256(body).hexdigest(), "path_is_local": True}
        assert (await result(agent, second))["sha256"] == hashlib.sha256(body + b"+").hexdigest()
    for tid in (first, second):
        env = job_env(fake, tid)
        assert env.get("CONTROLPLANE_INPUT_FILES") == "1"  # it has file inputs: its runner read them
        assert (env.get("CONTROLPLANE_STORE_ACCESS") == "grants") == (access == "grants")
        if access == "grants":
            assert not [k for k in env if k.startswith(CLOUD_VARS)], env


def job_env(fake: Any, tid: str) -> dict[str, str]:
    """The environment the control plane gave the execution of a task's first attempt."""
    name = f"cp-{tid.removeprefix('tsk_')}-a1"
    [env] = [e["env"] for e in fake.executions() if e["env"].get("CONTROLPLANE_JOB_NAME") == name]
    return dict(env)
