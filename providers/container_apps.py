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

Resources and scratch disk: a start's template carries the full container, with cpu and memory
from the resource class on Azure's Consumption steps (`azure/options.py`).

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
* logs = Log Analytics, held back a settling time for ingestion delay, within a per-workspace
  query limiter (`azure/loganalytics.py`). log_link = the execution in the Azure portal.

Credentials: azure-identity's DefaultAzureCredential (the managed identity in Azure; `az login` on
a laptop). ARM limits reads (a bucket refilled at 25/s) and writes (10/s) per subscription and
principal: every HTTP request, retries included, holds a place in a shared limiter for its kind
(`MAX_READS_PER_S`, `MAX_WRITES_PER_S`), and azure-core's retry honours Retry-After. A 429 or 5xx
that outlasts the retries is a TransientProviderError, which never fails a task; a refusal for
quota or capacity is a CapacityProviderError (`azure/arm.py`).

Settings (`CONTROLPLANE_CONTAINER_APPS_*`): `SUBSCRIPTION_ID`, `ENDPOINT` (ARM, default
https://management.azure.com), `LOGS_ENDPOINT` (default https://api.loganalytics.io),
`WORKSPACE_ID`, `CA_BUNDLE` (a PEM to trust: private endpoints, local fakes), `ANONYMOUS` (send a
placeholder token: fakes only), `MAX_READS_PER_S`, `MAX_WRITES_PER_S`, `LOG_QUERIES_PER_MIN`,
`LOG_SETTLE_S`, `LOG_TABLE`, `POLL_INTERVAL_S`, `STUCK_AFTER_S`, `RETRY_TOTAL`, `RETRY_BACKOFF_S`,
`LIST_LAG_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.appcontainers import ContainerAppsAPIClient
from azure.mgmt.appcontainers import models as aca

from controlplane_providers import ratelimit
from controlplane_providers.azure.arm import (
    AZURE_ERRORS,
    LimiterPolicy,
    PlaceholderCredential,
    StartRetriedOnlyOn429,
    classify,
)
from controlplane_providers.azure.executions import MARKER, PHASES, execution_status, marker, started
from controlplane_providers.azure.loganalytics import LogReader, kql
from controlplane_providers.azure.options import (
    CONSUMPTION,
    STORAGE_TABLE,
    ContainerAppsOptions,
    ContainerAppsSettings,
    consumption_shape,
    ephemeral_storage_mb,
    job_parts,
)
from controlplane_providers.base import (
    Capability,
    Handle,
    JobStatus,
    LaunchSpec,
    LogPage,
    PermanentProviderError,
    Provider,
    ProviderContext,
    Shape,
    TransientProviderError,
)

__all__ = ["MARKER", "PHASES", "ContainerAppsHandle", "ContainerAppsOptions", "ContainerAppsProvider",
           "ContainerAppsSettings", "consumption_shape", "ephemeral_storage_mb", "kql"]

log = logging.getLogger("controlplane.providers.container_apps")
T = TypeVar("T")


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
    own_stores = ("az://",)  # by the identity its jobs run as
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
            self.credential: Any = PlaceholderCredential()
        else:
            from azure.identity import DefaultAzureCredential

            self.credential = DefaultAzureCredential()
        self._tls: dict[str, Any] = {"connection_verify": str(settings.ca_bundle)} if settings.ca_bundle else {}
        self._clients: dict[str, ContainerAppsAPIClient] = {}
        self._lock = threading.Lock()
        self._logs = LogReader(lambda: self.settings, self.credential, self._tls)
        self._containers: dict[str, tuple[str, str | None]] = {}  # job id -> (container name, image)
        self._unsure: dict[str, float] = {}  # job_name -> when its start was ambiguous (monotonic)
        self._markers: dict[str, str | None] = {}  # execution id -> its marker, read by GET (a template never changes)

    # ---- clients: one per subscription, every try through the shared limiters -------------------
    def _client(self, job_id: str) -> ContainerAppsAPIClient:
        subscription = job_parts(job_id)[0]
        with self._lock:
            client = self._clients.get(subscription)
            if client is None:
                endpoint = self.settings.endpoint or "https://management.azure.com"

                def limiter(kind: str, rate: float) -> ratelimit.SlidingWindowLimiter:
                    return ratelimit.shared(ratelimit.key(f"arm-{kind}", account=subscription, endpoint=endpoint), rate)

                client = self._clients[subscription] = ContainerAppsAPIClient(
                    self.credential, subscription, base_url=endpoint, polling_interval=0,
                    retry_policy=StartRetriedOnlyOn429(retry_total=self.settings.retry_total,
                                                        retry_status=self.settings.retry_total,
                                                        retry_backoff_factor=self.settings.retry_backoff_s,
                                                        retry_backoff_max=8),
                    per_retry_policies=[LimiterPolicy(limiter("reads", self.settings.max_reads_per_s),
                                                       limiter("writes", self.settings.max_writes_per_s))],
                    connection_timeout=10, read_timeout=30, **self._tls)
            return client

    def _call(self, job_id: str, what: str, fn: Callable[[ContainerAppsAPIClient], T]) -> T:
        try:
            return fn(self._client(job_id))
        except AZURE_ERRORS as e:
            raise classify(e, f"Container Apps {what}") from e

    def _execution(self, job_id: str, name: str) -> aca.JobExecution:
        """One execution of the job, read by GET."""
        _, rg, job = job_parts(job_id)
        return self._call(job_id, "get execution", lambda c: c.job_execution(rg, job, name))

    # ---- launch / find --------------------------------------------------------------------------
    def _container(self, job_id: str, opts: ContainerAppsOptions) -> tuple[str, str | None]:
        """The (name, image) the job's own template gives its first container, read once."""
        known = self._containers.get(job_id)
        if known is None:
            _, rg, job = job_parts(job_id)
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
        _, rg, job = job_parts(job_id)
        answers: list[Any] = []  # the start's HTTP answers (azure-core's raw_response_hook)

        def start(c: ContainerAppsAPIClient) -> str | None:
            poller = c.jobs.begin_start(rg, job, template=template, polling=False,
                                        raw_response_hook=lambda r: answers.append(r.http_response))
            if not answers or not answers[-1].body():
                return None  # a bare 202 (Location only): the SDK would fail to parse the empty body
            return poller.result().name

        try:
            execution = self._call(job_id, "start", start)
        except TransientProviderError as e:
            cause = e.__cause__
            if not (isinstance(cause, HttpResponseError) and cause.status_code == 429):
                self._unsure[spec.job_name] = time.monotonic()  # it may have started: `find` must look a while
            raise
        if not execution:
            # Accepted without naming the execution: look it up by its marker rather than guess.
            self._unsure[spec.job_name] = time.monotonic()
            found = self.find(spec)
            if found is None:  # (find raises while the list may lag; this is past LIST_LAG_S = 0)
                raise TransientProviderError("the job start was accepted without naming its execution, which is not "
                                             "listed; looking again before starting again")
            return found
        self._unsure.pop(spec.job_name, None)
        return self._handle(execution, job_id, spec, time.time())

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
        found.sort(key=lambda ex: started(ex) or 0.0, reverse=True)
        return [self._handle(ex.name, job_id, spec, started(ex) or time.time()) for ex in found]

    def same_job(self, a: ContainerAppsHandle, b: ContainerAppsHandle) -> bool:
        return a.job == b.job and a.execution == b.execution

    def _marker_of(self, job_id: str, ex: Any) -> str | None:
        """An execution's marker: from the list's copy of its template, else from a GET of it
        (remembered: an execution's template never changes)."""
        if ex.properties is not None and ex.properties.template is not None:
            return marker(ex)
        key = ex.id or f"{job_id}/executions/{ex.name}"
        if key not in self._markers:
            try:
                full = self._execution(job_id, ex.name)
            except PermanentProviderError as e:
                if not isinstance(e.__cause__, ResourceNotFoundError):
                    raise
                return None  # gone since it was listed (not remembered: its name cannot come back)
            if len(self._markers) >= 100_000:
                self._markers.clear()
            self._markers[key] = marker(full)
        return self._markers[key]

    def _list(self, job_id: str, until: Callable[[set[str]], bool] | None = None) -> list[Any]:
        """The job's executions, page by page (each page one request), stopping early once
        `until(names seen)` holds."""
        _, rg, job = job_parts(job_id)
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
            listed = self._list(job_id, until=wanted.issubset)
            seen.update((ex.name, ex) for ex in listed if ex.name in wanted)
            for name in wanted - seen.keys():  # not listed: confirm before calling it gone
                try:
                    seen[name] = self._execution(job_id, name)
                except PermanentProviderError as e:
                    if not isinstance(e.__cause__, ResourceNotFoundError):
                        raise
        return [self._status(h, seen.get(h.execution), now) for h in handles]

    def _status(self, h: ContainerAppsHandle, ex: Any, now: float) -> JobStatus:
        return execution_status(ex, now, h.created_at, h.stuck_after_s or self.settings.stuck_after_s, h.on_stuck)

    # ---- cancel ---------------------------------------------------------------------------------
    def cancel(self, handle: ContainerAppsHandle, reason: str = "cancelled") -> None:
        _, rg, job = job_parts(handle.job)
        try:
            self._call(handle.job, "stop execution",
                       lambda c: c.jobs.begin_stop_execution(rg, job, handle.execution, polling=False))
        except PermanentProviderError as e:
            # Gone (404) or already ended (409/400): nothing left to stop.
            if getattr(e.__cause__, "status_code", 0) not in (400, 404, 409):
                raise

    def logs(self, handle: ContainerAppsHandle, cursor: str | None, limit: int) -> LogPage:
        return self._logs.page(handle.execution, handle.job, handle.created_at, handle.workspace_id, cursor, limit)

    def _read_logs(self, handle: ContainerAppsHandle, cursor: str | None, limit: int) -> LogPage:
        """One page read now, not shared with concurrent tails."""
        return self._logs.read(handle.execution, handle.job, handle.created_at, handle.workspace_id, cursor, limit)

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
