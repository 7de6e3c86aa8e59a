"""A cloud that refuses a launch for room or quota answers CapacityProviderError, told apart from
throttling (still transient, still retried) and from a bad request, through the real SDK clients
against each cloud's wire-level fake answering as the service does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane_providers import ratelimit
from controlplane_providers.base import CapacityProviderError, LaunchSpec, TransientProviderError
from tests import gcp

pytest.importorskip("google.cloud.run_v2")
from controlplane_providers.cloud_run import CloudRunOptions, CloudRunProvider  # noqa: E402


def spec(job_name: str, options: object) -> LaunchSpec:
    return LaunchSpec(task_id="tsk_" + job_name, attempt=1, job_name=job_name, tool_name="t", owner="me",
                      command=("python", "-c", "pass"), image=None, env={"CONTROLPLANE_JOB_NAME": job_name},
                      cpu=1, memory_mb=512, gpu=0, scratch_mb=0, max_runtime_s=60, resource_class="default",
                      options=options)


# ---- Cloud Run: 429 RESOURCE_EXHAUSTED, told apart by its ErrorInfo reason ---------------------------
@pytest.fixture
def cloud_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[gcp.FakeCloudRun, CloudRunProvider]]:
    with gcp.FakeCloudRun(start_jobs=False) as fake:
        fake.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER)
        for k, v in {"ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "MAX_TPS": "500",
                     "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "30"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        ratelimit._registry.clear()
        yield fake, CloudRunProvider.configured(tmp_path)  # type: ignore[misc]


def run_calls(fake: gcp.FakeCloudRun) -> int:
    return sum(1 for _, method, path in fake.requests if method == "POST" and path.endswith(":run"))


def cloud_run_spec(name: str) -> LaunchSpec:
    return spec(name, CloudRunOptions(project=gcp.PROJECT, region=gcp.REGION, job=gcp.JOB))


def test_cloud_run_refused_for_an_allocation_quota_is_a_capacity_error_asked_once(
        cloud_run: tuple[gcp.FakeCloudRun, CloudRunProvider]) -> None:
    fake, provider = cloud_run
    s = cloud_run_spec("cp-quota-a1")
    fake.quota_refusals = 1
    with pytest.raises(CapacityProviderError, match="quota"):
        provider.launch(s)
    assert run_calls(fake) == 1 and fake.executions() == []  # not retried in place; nothing made
    assert provider.find(s) is None  # nothing may have started: no "look again later"
    handle = provider.launch(s)  # room again: it launches once
    assert [e["name"] for e in fake.executions()] == [handle.execution]


def test_cloud_run_throttled_by_a_rate_quota_is_retried_and_then_transient(
        cloud_run: tuple[gcp.FakeCloudRun, CloudRunProvider], tmp_path: Path) -> None:
    fake, provider = cloud_run
    fake.rate_refusals = 2
    handle = provider.launch(cloud_run_spec("cp-rate-a1"))
    assert run_calls(fake) == 3 and [e["name"] for e in fake.executions()] == [handle.execution]

    impatient = CloudRunProvider.configured(tmp_path, retry_deadline_s=0)
    fake.rate_refusals = 1
    with pytest.raises(TransientProviderError) as refused:
        impatient.launch(cloud_run_spec("cp-rate2-a1"))
    assert not isinstance(refused.value, CapacityProviderError)
    assert len(fake.executions()) == 1


# ---- Container Apps: ARM's quota refusal of a job start, and its throttling ----------------------------
@pytest.fixture
def container_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, object]]:
    pytest.importorskip("azure.mgmt.appcontainers")
    from controlplane_providers.container_apps import ContainerAppsProvider
    from tests import azure

    with azure.FakeAzure(start_jobs=False) as fake:
        fake.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        for k, v in {"SUBSCRIPTION_ID": azure.SUBSCRIPTION, "ENDPOINT": fake.url, "LOGS_ENDPOINT": fake.url,
                     "CA_BUNDLE": fake.ca_file, "ANONYMOUS": "1", "MAX_READS_PER_S": "500", "MAX_WRITES_PER_S": "500",
                     "RETRY_BACKOFF_S": "0.02", "LIST_LAG_S": "30"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CONTAINER_APPS_{k}", v)
        ratelimit._registry.clear()
        yield fake, ContainerAppsProvider.configured(tmp_path)


def aca_spec(name: str) -> LaunchSpec:
    from controlplane_providers.container_apps import ContainerAppsOptions
    from tests import azure

    return spec(name, ContainerAppsOptions(job=azure.JOB, resource_group=azure.RESOURCE_GROUP))


def start_calls(fake: object) -> int:
    return sum(1 for _, method, path in fake.requests if method == "POST" and path.endswith("/start"))  # type: ignore[attr-defined]


def test_container_apps_start_refused_for_quota_is_a_capacity_error(container_apps: tuple[object, object]) -> None:
    fake, provider = container_apps
    s = aca_spec("cp-acaquota-a1")
    fake.quota_refusals = 1  # type: ignore[attr-defined]
    with pytest.raises(CapacityProviderError, match="OperationNotAllowed"):
        provider.launch(s)  # type: ignore[attr-defined]
    assert start_calls(fake) == 1 and fake.executions() == []  # type: ignore[attr-defined]
    assert provider.find(s) is None  # type: ignore[attr-defined]  # refused before anything was made
    handle = provider.launch(s)  # type: ignore[attr-defined]
    assert [e["name"] for e in fake.executions()] == [handle.execution]  # type: ignore[attr-defined]


def test_container_apps_start_throttled_is_retried_in_place(container_apps: tuple[object, object]) -> None:
    fake, provider = container_apps
    fake.start_throttles = 2  # type: ignore[attr-defined]
    handle = provider.launch(aca_spec("cp-acarate-a1"))  # type: ignore[attr-defined]
    assert start_calls(fake) == 3 and [e["name"] for e in fake.executions()] == [handle.execution]  # type: ignore[attr-defined]
