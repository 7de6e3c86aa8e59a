"""Container Apps' settings, a catalog entry's options, and the shapes Azure allows.

Resources: a start's template REPLACES the job's containers, so every start carries the full
container: the image (the tool's `image`, else the job's own, read once per job), the tool's
command as args after the image's entrypoint, the runner's env, and cpu/memory from the resource
class. On the Consumption profile Azure allows cpu in steps of 0.25 vCPU up to 4 with 2 GiB of
memory per vCPU: the catalog is checked against that when it loads, and a task asking for less
than its class gets the smallest allowed shape that covers what it asked. A GPU needs a GPU
workload profile.

Scratch disk comes with the shape: Azure gives a replica ephemeral storage (its containers' file
systems and EmptyDir volumes together) by its vCPUs: 0.25 or less 1 GiB, 0.5 or less 2 GiB, 1 or
less 4 GiB, more 8 GiB (learn.microsoft.com/azure/container-apps/storage-mounts). The storage is
not set per execution (ContainerResources.ephemeralStorage is read-only), so on the Consumption
profile a task's `resources.scratch_mb` is applied by choosing a shape big enough for it (a task
asking 0.25 vCPU and 3000 MiB of scratch runs on 0.75 vCPU with 1.5 GiB, which has 4 GiB), and the
most a task of a class may ask is what the class's own shape has. On a dedicated workload
profile this provider sends the class's cpu and memory as they are and guarantees no scratch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator
from pydantic_settings import SettingsConfigDict

from controlplane_providers.errors import PermanentProviderError
from controlplane_providers.options import ProviderSettings, WaitPolicy

CONSUMPTION = "Consumption"

# A replica's ephemeral storage (GiB) by its vCPUs: (at most this many vCPUs, storage).
EPHEMERAL_STORAGE_GIB = ((0.25, 1), (0.5, 2), (1.0, 4), (math.inf, 8))
STORAGE_TABLE = "0.25 vCPU or less: 1 GiB, 0.5: 2 GiB, 1: 4 GiB, more: 8 GiB"


def ephemeral_storage_mb(cpu: float) -> int:
    """The ephemeral storage Azure gives a replica of `cpu` vCPUs."""
    return next(gib for most, gib in EPHEMERAL_STORAGE_GIB if cpu <= most + 1e-9) * 1024


def consumption_shape(cpu: float, memory_mb: int, scratch_mb: int = 0) -> tuple[float, int]:
    """The smallest Consumption shape (cpu in 0.25 steps, 2 GiB per vCPU) covering cpu, memory and
    scratch disk (ValueError past the 8 GiB a replica can have)."""
    quarters = max(1, math.ceil(round(cpu * 4, 6)), math.ceil(round(memory_mb / 512, 6)))
    while ephemeral_storage_mb(quarters / 4) < scratch_mb:
        if quarters >= 16:
            raise ValueError(f"scratch_mb={scratch_mb} exceeds the {ephemeral_storage_mb(4)} MiB of ephemeral storage "
                             "a Container Apps replica can have")
        quarters += 1
    return quarters / 4, quarters * 512


class ContainerAppsSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_CONTAINER_APPS_", extra="ignore")

    subscription_id: str | None = None
    endpoint: str | None = None  # ARM base URL (default https://management.azure.com)
    logs_endpoint: str | None = None  # Log Analytics query API (default https://api.loganalytics.io)
    workspace_id: str | None = None  # Log Analytics workspace of the jobs' environment
    ca_bundle: Path | None = None  # a PEM bundle to trust (private endpoints, local fakes)
    anonymous: bool = False  # send a placeholder bearer token (local fakes only)
    max_reads_per_s: float = Field(default=20.0, gt=0)  # ARM refills reads at 25/s per principal
    max_writes_per_s: float = Field(default=8.0, gt=0)  # ... and writes at 10/s
    log_queries_per_min: int = Field(default=60, ge=1)  # Log Analytics queries, per workspace
    log_settle_s: float = Field(default=60.0, ge=0)  # rows younger than this are not read yet
    # The console-log table: the log-analytics destination's, the azure-monitor one's, or whichever the workspace has.
    log_table: Literal["auto", "ContainerAppConsoleLogs_CL", "ContainerAppConsoleLogs"] = "auto"
    list_lag_s: float = Field(default=60.0, ge=0)  # after an ambiguous start, how long `find` keeps looking
    poll_interval_s: float = Field(default=10.0, gt=0)
    stuck_after_s: float = Field(default=900.0, gt=0)
    retry_total: int = Field(default=8, ge=0)  # azure-core's retries of one call (429/5xx)
    retry_backoff_s: float = Field(default=0.8, ge=0)  # its exponential backoff factor (when no Retry-After)


class ContainerAppsOptions(WaitPolicy):
    job: str = Field(min_length=1)
    resource_group: str | None = None
    subscription_id: str | None = None
    container: str | None = None
    workload_profile: str = CONSUMPTION
    workspace_id: str | None = None
    # The job environment's Azure region (`eastus`), for the price table only; None: its default.
    region: str | None = None

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo) -> ContainerAppsOptions:
        if self.job.startswith("/"):
            parts = self.job.strip("/").split("/")
            if (len(parts) != 8 or parts[0].lower() != "subscriptions" or parts[2].lower() != "resourcegroups"
                    or parts[4].lower() != "providers" or parts[5].lower() != "microsoft.app" or parts[6].lower() != "jobs"
                    or not all(parts[1::2])):
                raise ValueError("job: an ARM id is /subscriptions/S/resourceGroups/RG/providers/Microsoft.App/jobs/J")
        elif "/" in self.job:
            raise ValueError("job: a job name, or /subscriptions/S/resourceGroups/RG/providers/Microsoft.App/jobs/J")
        elif not self.resource_group:
            raise ValueError("resource_group: required with a short job name")
        res = info.context or {}
        if self.workload_profile == CONSUMPTION and "cpu" in res:
            cpu, memory_mb = float(res["cpu"]), int(res["memory_mb"])
            if res.get("gpu"):
                raise ValueError("workload_profile: a GPU needs a GPU workload profile (Consumption has none)")
            quarters = cpu * 4
            if quarters != int(quarters) or not 1 <= quarters <= 16 or memory_mb != int(quarters) * 512:
                near_cpu, near_mem = consumption_shape(min(cpu, 4.0), min(memory_mb, 8192))
                raise ValueError(
                    f"workload_profile: resource class {res.get('resource_class', '?')!r} asks cpu {cpu:g} with "
                    f"memory_mb {memory_mb}; Azure Container Apps (Consumption) allows cpu 0.25 to 4 in steps of "
                    f"0.25 with 2 GiB per vCPU (e.g. cpu {near_cpu:g} with memory_mb {near_mem}), or name a "
                    "dedicated workload_profile")
        return self

    def job_id(self, default_subscription: str | None) -> str:
        if self.job.startswith("/"):
            return "/" + self.job.strip("/")
        subscription = self.subscription_id or default_subscription
        if not subscription:
            raise PermanentProviderError("no Azure subscription: set provider_options.subscription_id or "
                                         "CONTROLPLANE_CONTAINER_APPS_SUBSCRIPTION_ID")
        return (f"/subscriptions/{subscription}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.App/jobs/{self.job}")


def job_parts(job_id: str) -> tuple[str, str, str]:
    """(subscription, resource group, job) of an ARM job id."""
    p = job_id.strip("/").split("/")
    return p[1], p[3], p[7]
