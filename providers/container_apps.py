"""Azure Container Apps Jobs: each task attempt is one execution of a Container Apps job (manual
trigger); its console output is in Log Analytics.

The operator provisions one job per tool family (the Terraform modules make them from the
catalog), in a Container Apps environment whose logs go to a Log Analytics workspace; the job's
image has the runner as its entrypoint (`infra/runner/Dockerfile`). A catalog entry names it in
`provider_options`:

    job              the job's name, or its ARM id /subscriptions/S/resourceGroups/RG/providers/Microsoft.App/jobs/J
    resource_group   the job's resource group (required with a short name)
    subscription_id  default: the CONTROLPLANE_CONTAINER_APPS_SUBSCRIPTION_ID setting
    container        the container's name in the execution (default: the job's first container's)
    workload_profile "Consumption" (default) or the name of a dedicated workload profile
    workspace_id     the Log Analytics workspace (customer id) of the job's environment, for `logs`
                     (default: the WORKSPACE_ID setting)
    stuck_after_s, on_stuck   as for the other clouds: an execution still waiting after this long
                     is reported as waiting ("wait") or stopped and failed with LAUNCH_FAILED ("fail")

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

How it maps the core's contract onto Azure:

* launch = `jobs.begin_start(rg, job, template=...)`. The execution's name is in the first answer
  (202 + body); the long-running poller is never waited on. A start is NOT idempotent: azure-core
  would retry a POST on 500/503/504 or any answer with Retry-After, and the execution may exist by
  then, so a start is retried in place only on 429 (refused before anything was done); the
  control plane's launch retry looks the execution up with `find` first. An answer that does not
  name the execution (the spec allows a bare 202 with only `Location`), or a start that failed
  after it may have been accepted, is an ambiguous start: the execution is looked up by its
  marker, and for `LIST_LAG_S` after it an empty look is "not listed yet", never "not started".
* find = list the job's executions and match the attempt's own marker, `CONTROLPLANE_JOB_NAME`
  in the execution template's env; an execution listed without its template is read with one
  GET (remembered) before the list is taken as proof that nothing was started.
* poll: there is no batch get, so `poll_key` is the job: one paged `jobs_executions.list` per job
  per cycle (nextLink paging, stopping once every watched execution was seen). No `$filter`: the
  documented form matches one status, and a filter on Running would hide the executions still
  Processing and those that just ended, each of which would then cost a GET; unfiltered, the list
  is what is in flight plus the job's short history. An execution the list lacks is confirmed
  with one GET before it is called GONE (the outcome then comes from the object store).
* cancel = `begin_stop_execution` (first answer only), idempotent: an execution already ended
  or gone answers as stopped; the control plane repeats it until the execution reports it ended.
  Some executions ignore stop (microsoft/azure-container-apps#1071): past the control plane's
  stop_confirm_timeout_s the task ends anyway and the job is recorded as abandoned (kept in view
  and still stopped now and then until Azure says it ended).
* The handle (`ContainerAppsHandle`) is the execution's name with its job's ARM id, the start
  time, the Log Analytics workspace and the waiting policy.
* logs = Log Analytics: the environment's "log-analytics" destination writes table
  `ContainerAppConsoleLogs_CL` (columns `..._s`), its "azure-monitor" destination (a diagnostic
  setting) `ContainerAppConsoleLogs` (`Log`, `Stream`, `ContainerGroupName`); `LOG_TABLE` names
  one, or `auto` takes the one the workspace has (the _CL one first; a workspace without it
  answers "failed to resolve table", and the other is used from then on). Rows of the replicas
  of the execution (`{execution}-...`), oldest first, in the service's order (TimeGenerated, then
  `_ItemId`); cursor = TimeGenerated as 100 ns ticks + `_ItemId`, both in the query, so any
  number of rows at one instant pages through. Times are read as text (`tostring`, whatever
  precision the service writes) and parsed to ticks, never compared as text. Rows reach Log Analytics 30 s to a few
  minutes after they are written (ingestion delay) and a row ingested late with an earlier
  TimeGenerated than the cursor would be skipped; so the tail holds back the newest
  `LOG_SETTLE_S` seconds (default 60), trading freshness for completeness. The runner's relay
  (the default log source) has every line at once. Queries take a place in a per-workspace
  limiter (`LOG_QUERIES_PER_MIN`) without waiting. log_link = the execution in the Azure portal.

Credentials: azure-identity's DefaultAzureCredential (the managed identity in Azure; `az login` on
a laptop). ARM limits reads (a bucket refilled at 25/s) and writes (10/s) per subscription and
principal: every HTTP request, retries included, holds a place in a shared limiter for its kind
(`MAX_READS_PER_S`, `MAX_WRITES_PER_S`), and azure-core's retry honours Retry-After. A 429 or 5xx
that outlasts the retries is a TransientProviderError, which never fails a task.

Settings (`CONTROLPLANE_CONTAINER_APPS_*`): `SUBSCRIPTION_ID`, `ENDPOINT` (ARM, default
https://management.azure.com), `LOGS_ENDPOINT` (default https://api.loganalytics.io),
`WORKSPACE_ID`, `CA_BUNDLE` (a PEM to trust: private endpoints, local fakes), `ANONYMOUS` (send a
placeholder token: fakes only), `MAX_READS_PER_S`, `MAX_WRITES_PER_S`, `LOG_QUERIES_PER_MIN`,
`LOG_SETTLE_S`, `LOG_TABLE`, `POLL_INTERVAL_S`, `STUCK_AFTER_S`, `RETRY_TOTAL`, `RETRY_BACKOFF_S`,
`LIST_LAG_S`.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.policies import RetryPolicy
from azure.mgmt.appcontainers import ContainerAppsAPIClient
from azure.mgmt.appcontainers import models as aca
from pydantic import Field, ValidationInfo, model_validator
from pydantic_settings import SettingsConfigDict

from controlplane_providers import logtail, ratelimit
from controlplane_providers.base import (
    Capability,
    Handle,
    JobPhase,
    JobStatus,
    LaunchSpec,
    LogLine,
    LogPage,
    PermanentProviderError,
    Provider,
    ProviderContext,
    ProviderSettings,
    Shape,
    TransientProviderError,
    WaitPolicy,
    waiting_verdict,
)

log = logging.getLogger("controlplane.providers.container_apps")

MARKER = "CONTROLPLANE_JOB_NAME"  # the env var that names an execution's task attempt
CONSUMPTION = "Consumption"
LOG_TABLE = "ContainerAppConsoleLogs_CL"  # the "log-analytics" destination's table
MONITOR_TABLE = "ContainerAppConsoleLogs"  # the "azure-monitor" destination's (a diagnostic setting)
# Each table's columns for what a tail reads: (replica, message, stream).
LOG_COLUMNS = {LOG_TABLE: ("ContainerGroupName_s", "Log_s", "Stream_s"),
               MONITOR_TABLE: ("ContainerGroupName", "Log", "Stream")}
TICKS_PER_S = 10_000_000  # Log Analytics' datetime resolution: 100 ns
# Execution status -> our phase: the one table. Degraded (a replica failing while the execution
# still runs) stays RUNNING: the runner's heartbeat, not a guess, decides that it is lost. Unknown
# is waited on like a start (reported, and given up on per on_stuck).
PHASES: dict[str, JobPhase] = {
    "Processing": JobPhase.PENDING,
    "Unknown": JobPhase.PENDING,
    "Running": JobPhase.RUNNING,
    "Degraded": JobPhase.RUNNING,
    "Succeeded": JobPhase.SUCCEEDED,
    "Failed": JobPhase.FAILED,
    "Stopped": JobPhase.FAILED,
}
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
AZURE_ERRORS = (HttpResponseError, ServiceRequestError, ServiceResponseError)  # what azure-core raises for a call


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


def _parts(job_id: str) -> tuple[str, str, str]:
    """(subscription, resource group, job) of an ARM job id."""
    p = job_id.strip("/").split("/")
    return p[1], p[3], p[7]


class _PlaceholderCredential:
    """A token for local fakes (`ANONYMOUS`): azure-core sends bearer tokens only over https."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("anonymous", int(time.time()) + 3600)


class _LimiterPolicy:
    """An azure-core per-retry policy: every HTTP try holds a place in the limiter of its kind
    (reads: GET/HEAD; writes: the rest) from before it is sent until it has ended."""

    next: Any = None

    def __init__(self, reads: ratelimit.SlidingWindowLimiter, writes: ratelimit.SlidingWindowLimiter):
        self.reads, self.writes = reads, writes

    def send(self, request: Any) -> Any:
        method = request.http_request.method.upper()
        with ratelimit.held(self.reads if method in ("GET", "HEAD") else self.writes) as held:
            response = self.next.send(request)
            held.status = response.http_response.status_code
            return response


class _StartRetriedOnlyOn429(RetryPolicy):
    """azure-core retries a POST on 500/503/504, and any answer that carries Retry-After. A job
    start that failed that way may have created its execution, so a start is retried in place
    only on 429; the control plane's launch retry calls `find` first."""

    def is_retry(self, settings: dict[str, Any], response: Any) -> bool:
        request = response.http_request
        if request.method.upper() == "POST" and request.url.split("?", 1)[0].endswith("/start"):
            return response.http_response.status_code == 429
        return super().is_retry(settings, response)


def _classify(e: Exception, what: str) -> Exception:
    if isinstance(e, ServiceRequestError | ServiceResponseError):
        return TransientProviderError(f"{what}: {type(e).__name__}")
    if isinstance(e, HttpResponseError):
        code = getattr(e.error, "code", None)
        if (e.status_code or 0) in TRANSIENT_STATUS:
            return TransientProviderError(f"{what}: HTTP {e.status_code} {code or ''}".rstrip())
        return PermanentProviderError(f"{what}: HTTP {e.status_code} {code or ''}: {e.message}")
    return e


@dataclass(frozen=True)
class ContainerAppsHandle(Handle):
    """An execution: its name and its job's ARM id (the poll key), and what polls and log reads
    need without asking Azure again."""

    execution: str
    job: str  # /subscriptions/S/resourceGroups/RG/providers/Microsoft.App/jobs/J
    job_name: str
    created_at: float | None = None
    workspace_id: str | None = None  # None: the WORKSPACE_ID setting
    stuck_after_s: float | None = None  # None: the provider's setting
    on_stuck: str = "wait"


class ContainerAppsProvider(Provider[ContainerAppsHandle]):
    name = "container_apps"
    Settings = ContainerAppsSettings
    Options = ContainerAppsOptions
    handle_type = ContainerAppsHandle
    poll_batch_size = 1_000_000  # a whole job's watched executions in one call (one paged list)
    capabilities = frozenset({Capability.LOGS, Capability.LOG_LINK, Capability.SCRATCH})

    def __init__(self, settings: ContainerAppsSettings, context: ProviderContext):
        self.settings = settings
        self.poll_interval_s = settings.poll_interval_s
        self.kill_grace_s = context.kill_grace_s
        if settings.anonymous:
            self.credential: Any = _PlaceholderCredential()
        else:
            from azure.identity import DefaultAzureCredential

            self.credential = DefaultAzureCredential()
        self._tls = {"connection_verify": str(settings.ca_bundle)} if settings.ca_bundle else {}
        self._clients: dict[str, ContainerAppsAPIClient] = {}
        self._logs_client: Any = None
        self._lock = threading.Lock()
        self._pages = logtail.SharedPages()
        self._containers: dict[str, tuple[str, str | None]] = {}  # job id -> (container name, image)
        self._unsure: dict[str, float] = {}  # job_name -> when its start was ambiguous (monotonic)
        self._markers: dict[str, str | None] = {}  # execution id -> its marker, read by GET (a template never changes)
        self._tables: dict[str, str] = {}  # workspace -> the console-log table found there (LOG_TABLE auto)

    # ---- clients: one per subscription, every try through the shared limiters -------------------
    def _client(self, job_id: str) -> ContainerAppsAPIClient:
        subscription = _parts(job_id)[0]
        with self._lock:
            client = self._clients.get(subscription)
            if client is None:
                endpoint = self.settings.endpoint or "https://management.azure.com"

                def limiter(kind: str, rate: float) -> ratelimit.SlidingWindowLimiter:
                    return ratelimit.shared(ratelimit.key(f"arm-{kind}", account=subscription, endpoint=endpoint), rate)

                client = self._clients[subscription] = ContainerAppsAPIClient(
                    self.credential, subscription, base_url=endpoint, polling_interval=0,
                    retry_policy=_StartRetriedOnlyOn429(retry_total=self.settings.retry_total,
                                                        retry_status=self.settings.retry_total,
                                                        retry_backoff_factor=self.settings.retry_backoff_s,
                                                        retry_backoff_max=8),
                    per_retry_policies=[_LimiterPolicy(limiter("reads", self.settings.max_reads_per_s),
                                                       limiter("writes", self.settings.max_writes_per_s))],
                    connection_timeout=10, read_timeout=30, **self._tls)
            return client

    def _call(self, job_id: str, what: str, fn: Callable[[ContainerAppsAPIClient], Any]) -> Any:
        try:
            return fn(self._client(job_id))
        except AZURE_ERRORS as e:
            raise _classify(e, f"Container Apps {what}") from e

    # ---- launch / find --------------------------------------------------------------------------
    def _container(self, job_id: str, opts: ContainerAppsOptions) -> tuple[str, str | None]:
        """The (name, image) the job's own template gives its first container, read once."""
        known = self._containers.get(job_id)
        if known is None:
            _, rg, job = _parts(job_id)
            try:
                found = self._call(job_id, "get job", lambda c: c.jobs.get(rg, job))
            except PermanentProviderError as e:
                if isinstance(e.__cause__, ResourceNotFoundError):
                    raise PermanentProviderError(
                        f"the Container Apps job {job_id} does not exist (provider_options.job of the catalog names a "
                        "job the operator has not created)") from None
                raise
            containers = (found.properties.template.containers if found.properties and found.properties.template
                          else None) or []
            first = containers[0] if containers else None
            known = self._containers[job_id] = ((first.name if first else None) or "main",
                                                first.image if first else None)
        return (opts.container or known[0], known[1])

    def launch(self, spec: LaunchSpec) -> ContainerAppsHandle:
        opts: ContainerAppsOptions = spec.options
        cpu, memory_mb = (spec.cpu, spec.memory_mb)
        if opts.workload_profile == CONSUMPTION:
            try:
                cpu, memory_mb = consumption_shape(cpu, memory_mb, spec.scratch_mb)
            except ValueError as e:
                raise PermanentProviderError(str(e)) from None
        elif spec.scratch_mb:
            raise PermanentProviderError(f"scratch_mb={spec.scratch_mb}: {self.scratch_note(spec.shape)}")
        job_id = opts.job_id(self.settings.subscription_id)
        name, job_image = self._container(job_id, opts)
        image = spec.image or job_image
        if not image:
            raise PermanentProviderError(f"the Container Apps job {job_id} has no image and the tool names none")
        template = aca.JobExecutionTemplate(containers=[aca.JobExecutionContainer(
            name=name, image=image, args=list(spec.command),
            env=[aca.EnvironmentVar(name=k, value=v) for k, v in sorted(spec.env.items())],
            resources=aca.ContainerResources(cpu=cpu, memory=f"{memory_mb / 1024:g}Gi"))])
        _, rg, job = _parts(job_id)
        answers: list[Any] = []  # the start's HTTP answers (azure-core's raw_response_hook)

        def start(c: ContainerAppsAPIClient) -> str | None:
            poller = c.jobs.begin_start(rg, job, template=template, polling=False,
                                        raw_response_hook=lambda r: answers.append(r.http_response))
            if not answers or not answers[-1].body():
                return None  # a bare 202 (Location only): the SDK would fail to parse the empty body
            return poller.result().name

        try:
            name = self._call(job_id, "start", start)
        except TransientProviderError as e:
            cause = e.__cause__
            if not (isinstance(cause, HttpResponseError) and cause.status_code == 429):
                self._unsure[spec.job_name] = time.monotonic()  # it may have started: `find` must look a while
            raise
        if not name:
            # Accepted without naming the execution: look it up by its marker rather than guess.
            self._unsure[spec.job_name] = time.monotonic()
            found = self.find(spec)
            if found is None:  # (find raises while the list may lag; this is past LIST_LAG_S = 0)
                raise TransientProviderError("the job start was accepted without naming its execution, which is not "
                                             "listed; looking again before starting again")
            return found
        self._unsure.pop(spec.job_name, None)
        return self._handle(name, job_id, spec, time.time())

    def _handle(self, execution: str, job_id: str, spec: LaunchSpec, created_at: float) -> ContainerAppsHandle:
        opts: ContainerAppsOptions = spec.options
        return ContainerAppsHandle(execution=execution, job=job_id, job_name=spec.job_name, created_at=created_at,
                                   workspace_id=opts.workspace_id or self.settings.workspace_id,
                                   stuck_after_s=float(opts.stuck_after_s or self.settings.stuck_after_s),
                                   on_stuck=opts.on_stuck)

    def find(self, spec: LaunchSpec) -> ContainerAppsHandle | None:
        """The attempt's execution, by its marker. An execution the list shows without its
        template is read with a GET first. After an ambiguous start of this attempt an empty look
        raises TransientProviderError for `list_lag_s` (look again later) instead of answering
        None (start again): the list can lag behind the execution the start created."""
        found = self.find_all(spec)
        if not found:
            unsure = self._unsure.get(spec.job_name)
            if unsure is not None and time.monotonic() - unsure < self.settings.list_lag_s:
                raise TransientProviderError(f"{spec.job_name}: the job start may have created an execution that "
                                             "Azure does not list yet; looking again before starting again")
            self._unsure.pop(spec.job_name, None)
            return None
        self._unsure.pop(spec.job_name, None)
        if len(found) > 1:
            log.warning("%d Container Apps executions carry %s; following the newest", len(found), spec.job_name)
        return found[0]

    def find_all(self, spec: LaunchSpec) -> list[ContainerAppsHandle]:
        """Every execution of the job that carries the attempt's marker (an execution listed
        without its template read with a GET), newest first (what the list shows now: no lag
        rule, unlike `find`)."""
        opts: ContainerAppsOptions = spec.options
        job_id = opts.job_id(self.settings.subscription_id)
        found = [ex for ex in self._list(job_id) if self._marker_of(job_id, ex) == spec.job_name]
        found.sort(key=lambda ex: _started(ex) or 0.0, reverse=True)
        return [self._handle(ex.name, job_id, spec, _started(ex) or time.time()) for ex in found]

    def same_job(self, a: ContainerAppsHandle, b: ContainerAppsHandle) -> bool:
        return a.job == b.job and a.execution == b.execution

    def _marker_of(self, job_id: str, ex: Any) -> str | None:
        """An execution's marker: from the list's copy of its template, else from a GET of it
        (remembered: an execution's template never changes)."""
        if ex.properties is not None and ex.properties.template is not None:
            return _marker(ex)
        key = ex.id or f"{job_id}/executions/{ex.name}"
        if key not in self._markers:
            _, rg, job = _parts(job_id)
            try:
                full = self._call(job_id, "get execution", lambda c: c.job_execution(rg, job, ex.name))
            except PermanentProviderError as e:
                if not isinstance(e.__cause__, ResourceNotFoundError):
                    raise
                return None  # gone since it was listed (not remembered: its name cannot come back)
            if len(self._markers) >= 100_000:
                self._markers.clear()
            self._markers[key] = _marker(full)
        return self._markers[key]

    def _list(self, job_id: str, until: Callable[[set[str]], bool] | None = None) -> list[Any]:
        """The job's executions, page by page (each page one request), stopping early once
        `until(names seen)` holds."""
        _, rg, job = _parts(job_id)
        out: list[Any] = []

        def pages(c: ContainerAppsAPIClient) -> list[Any]:
            for page in c.jobs_executions.list(rg, job).by_page():
                out.extend(page)
                if until is not None and until({ex.name for ex in out}):
                    break
            return out

        return self._call(job_id, "list executions", pages)

    # ---- poll -----------------------------------------------------------------------------------
    def poll_key(self, handle: ContainerAppsHandle) -> Hashable:
        return handle.job

    def poll(self, handles: list[ContainerAppsHandle]) -> list[JobStatus]:
        if not handles:
            return []
        now = time.time()
        by_job: dict[str, set[str]] = {}
        for h in handles:
            by_job.setdefault(h.job, set()).add(h.execution)
        seen: dict[str, Any] = {}
        for job_id, wanted in by_job.items():
            listed = self._list(job_id, until=lambda names, w=wanted: w <= names)
            seen.update((ex.name, ex) for ex in listed if ex.name in wanted)
            _, rg, job = _parts(job_id)
            for name in wanted - seen.keys():  # not listed: confirm before calling it gone
                try:
                    seen[name] = self._call(job_id, "get execution", lambda c, n=name: c.job_execution(rg, job, n))
                except PermanentProviderError as e:
                    if not isinstance(e.__cause__, ResourceNotFoundError):
                        raise
        return [self._status(h, seen.get(h.execution), now) for h in handles]

    def _status(self, h: ContainerAppsHandle, ex: Any, now: float) -> JobStatus:
        if ex is None:
            return JobStatus(JobPhase.GONE, reason="Azure no longer lists this execution (its history is limited)",
                             raw_status="GONE")
        props = ex.properties or aca.JobExecutionProperties()
        status = str(getattr(props.status, "value", props.status) or "Unknown")
        phase = PHASES.get(status, JobPhase.PENDING)
        reason = ": ".join(p for p in (props.reason, props.message) if p) or None
        started, finished = _started(ex), _ts(props.end_time)
        waiting = give_up = None
        if phase == JobPhase.PENDING:
            waiting, give_up = waiting_verdict(status, now - (h.created_at or now),
                                               reason or "waiting for the execution to start",
                                               stuck_after_s=h.stuck_after_s or self.settings.stuck_after_s,
                                               on_stuck=h.on_stuck, noun="execution")
        elif phase == JobPhase.RUNNING:
            started = started or now
        return JobStatus(phase, reason=reason, started_at=started, finished_at=finished, waiting_reason=waiting,
                         give_up_reason=give_up, raw_status=status)

    # ---- cancel ---------------------------------------------------------------------------------
    def cancel(self, handle: ContainerAppsHandle, reason: str = "cancelled") -> None:
        _, rg, job = _parts(handle.job)
        try:
            self._call(handle.job, "stop execution",
                       lambda c: c.jobs.begin_stop_execution(rg, job, handle.execution, polling=False))
        except PermanentProviderError as e:
            # Gone (404) or already ended (409/400): nothing left to stop.
            if getattr(e.__cause__, "status_code", 0) not in (400, 404, 409):
                raise

    # ---- logs -----------------------------------------------------------------------------------
    def _logs(self) -> Any:
        with self._lock:
            if self._logs_client is None:
                from azure.monitor.query import LogsQueryClient

                self._logs_client = LogsQueryClient(self.credential,
                                                    endpoint=self.settings.logs_endpoint or "https://api.loganalytics.io",
                                                    retry_total=2, **self._tls)
            return self._logs_client

    def logs(self, handle: ContainerAppsHandle, cursor: str | None, limit: int) -> LogPage:
        return self._pages.get((handle.execution, cursor, limit), lambda: self._read_logs(handle, cursor, limit))

    def _read_logs(self, handle: ContainerAppsHandle, cursor: str | None, limit: int) -> LogPage:
        workspace = handle.workspace_id or self.settings.workspace_id
        if not workspace:
            return LogPage([], cursor, reason="no Log Analytics workspace is configured for this job (provider_options."
                                              "workspace_id or CONTROLPLANE_CONTAINER_APPS_WORKSPACE_ID)")
        _, _, job = _parts(handle.job)
        now = datetime.now(UTC)
        start = datetime.fromtimestamp((handle.created_at or time.time()) - 60, UTC)
        until = now - timedelta(seconds=self.settings.log_settle_s)
        if until <= start:
            return LogPage([], cursor, reason=f"Log Analytics rows are read once {self.settings.log_settle_s:g} s old "
                                              "(ingestion delay)")
        table = self.settings.log_table if self.settings.log_table != "auto" else self._tables.get(workspace, LOG_TABLE)
        limiter = ratelimit.shared(ratelimit.key("loganalytics", account=workspace, endpoint=self.settings.logs_endpoint),
                                   self.settings.log_queries_per_min, window_s=60.0)

        def query(table: str) -> Any:
            return self._logs().query_workspace(workspace, kql(job, handle.execution, cursor, until, limit, table),
                                                timespan=(start, now + timedelta(minutes=5)))

        def read() -> LogPage:
            nonlocal table
            try:
                try:
                    result = query(table)
                except HttpResponseError as e:
                    if self.settings.log_table != "auto" or not _no_table(e, table):
                        raise
                    table = self._tables[workspace] = MONITOR_TABLE if table == LOG_TABLE else LOG_TABLE
                    result = query(table)  # the workspace has the other destination's table
            except AZURE_ERRORS as e:
                raise _classify(e, "Log Analytics") from e
            tables = getattr(result, "tables", None) or getattr(result, "partial_data", None) or []
            rows = [dict(zip(tables[0].columns, row)) for row in tables[0].rows] if tables else []
            return _page(rows, cursor, limit)

        return logtail.within_quota(limiter, cursor, f"Log Analytics queries are limited to "
                                    f"{self.settings.log_queries_per_min} a minute per workspace here", read)

    def price_region(self, options: ContainerAppsOptions) -> str | None:
        return options.region

    def log_link(self, handle: ContainerAppsHandle) -> str | None:
        return f"https://portal.azure.com/#resource{handle.job}/executions/{handle.execution}"

    # ---- scratch disk: the shape's ephemeral storage ----------------------------------------------
    def scratch_limit_mb(self, shape: Shape) -> int | None:
        if shape.options.workload_profile != CONSUMPTION:
            return None
        return ephemeral_storage_mb(shape.cpu)

    def scratch_note(self, shape: Shape) -> str:
        if shape.options.workload_profile != CONSUMPTION:
            return (f"on the dedicated workload profile {shape.options.workload_profile!r} this provider sends the "
                    "resource class's cpu and memory as they are and guarantees no scratch disk")
        return (f"Azure Container Apps gives a replica ephemeral storage by its vCPUs ({STORAGE_TABLE}), and resource "
                f"class '{shape.resource_class}' allows {shape.cpu:g} vCPU: at most "
                f"{ephemeral_storage_mb(shape.cpu)} MiB")


def kql(job: str, execution: str, cursor: str | None, until: datetime, take: int, table: str = LOG_TABLE) -> str:
    """The first `take` console rows of one execution after `cursor` (see `_cursor`), oldest
    first in the service's order: TimeGenerated, then _ItemId, with the cursor's tiebreak in the
    query. A job's replicas are named `{execution}-{suffix}`. The time is read as text
    (`tostring`: all 100 ns digits, which a Python datetime would cut to microseconds)."""
    replica, message, stream = LOG_COLUMNS[table]
    where = f"{replica} startswith {_q(execution + '-')}"
    if table == LOG_TABLE:
        where = f"ContainerJobName_s == {_q(job)} and {where}"
    lines = [table, f"| where {where}"]
    after = _cursor(cursor)
    if after is not None:
        at = f"datetime({_render_ticks(after[0])})"
        lines.append(f"| where TimeGenerated > {at} or (TimeGenerated == {at} and strcmp(_ItemId, {_q(after[1])}) > 0)")
    lines += [f"| where TimeGenerated <= datetime({_render_ticks(_ticks_of(until))})",
              "| extend t = tostring(TimeGenerated)",
              "| order by TimeGenerated asc, _ItemId asc",
              f"| take {int(take)}",
              f"| project t, _ItemId, {message}, {stream}"]
    return "\n".join(lines)


def _page(rows: list[dict[str, Any]], cursor: str | None, limit: int) -> LogPage:
    """A page of `limit` lines from query rows (in the query's order) after `cursor`; its cursor
    is the last line's (time in ticks | _ItemId), or the old one."""
    after = _cursor(cursor)
    lines: list[LogLine] = []
    last = None
    for r in rows:
        key = (_parse_ticks(str(r["t"])), str(r["_ItemId"]))
        if after is not None and key <= after:
            continue  # (the query already excludes them; a row at the cursor is never returned twice)
        if len(lines) >= limit:
            break
        message = r.get("Log_s", r.get("Log"))
        stream = r.get("Stream_s", r.get("Stream"))
        lines.append(LogLine(ts=key[0] / TICKS_PER_S, message=str(message or "").rstrip("\n"),
                             stream=str(stream or "stdout")))
        last = key
    return LogPage(lines, f"{_render_ticks(last[0])}|{last[1]}" if last else cursor)


def _cursor(cursor: str | None) -> tuple[int, str] | None:
    """(TimeGenerated in 100 ns ticks since the epoch, _ItemId) of a log cursor, None for the
    start. A cursor is `time|_ItemId`, its time written with 7 fractional digits (any ISO form
    is read, cursors of earlier versions too)."""
    if not cursor:
        return None
    ts, _, item = cursor.partition("|")
    try:
        return _parse_ticks(ts), item
    except ValueError:
        return None  # not a cursor of ours: from the start


_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7})\d*)?(Z|[+-]\d{2}:?\d{2})?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _parse_ticks(text: str) -> int:
    """A time as Log Analytics writes it (any number of fractional digits, Z or an offset) ->
    100 ns ticks since the epoch, exactly (ValueError if it is not one)."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a time: {text!r}")
    y, mo, d, h, mi, s, frac, zone = m.groups()
    at = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=UTC)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        at -= sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[-2:]))
    return (at - _EPOCH) // timedelta(seconds=1) * TICKS_PER_S + int((frac or "0").ljust(7, "0"))


def _render_ticks(ticks: int) -> str:
    """100 ns ticks since the epoch -> `2026-11-23T10:00:00.1234567Z` (a KQL datetime literal)."""
    secs, frac = divmod(ticks, TICKS_PER_S)
    return (_EPOCH + timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:07d}Z"


def _ticks_of(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1) * 10


def _no_table(e: HttpResponseError, table: str) -> bool:
    """Log Analytics' answer to a query of a table the workspace does not have."""
    return e.status_code == 400 and f"'{table}'" in str(e.message or e) and "resolve" in str(e.message or e)


def _q(text: str) -> str:
    """A KQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _marker(execution: Any) -> str | None:
    template = execution.properties.template if execution.properties is not None else None
    for container in (template.containers if template is not None else None) or []:
        for env in container.env or []:
            if env.name == MARKER:
                return env.value
    return None


def _ts(t: datetime | None) -> float | None:
    return t.timestamp() if isinstance(t, datetime) else None


def _started(execution: Any) -> float | None:
    return _ts(execution.properties.start_time) if execution.properties is not None else None
