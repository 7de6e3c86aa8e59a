"""Google Cloud Run Jobs: each task attempt is one execution of a Cloud Run job; its logs are in
Cloud Logging.

The operator provisions one Cloud Run job per tool image and resource shape (the Terraform
modules make them from the catalog); the image's entrypoint is the runner
(`infra/runner/Dockerfile`). A catalog entry names the job in `provider_options`:

    project   the Google Cloud project (required unless `job` is a full resource name)
    region    the job's region (idem)
    job       the job's name, or `projects/P/locations/R/jobs/J`
    container the container to override in a multi-container job (default: the first)
    stuck_after_s, on_stuck   as for AWS Batch: an execution still pending after this long is
              reported as waiting ("wait") or stopped and failed with LAUNCH_FAILED ("fail")

What varies per task travels in the execution's overrides: the container's args (the tool's
command, after the image's runner entrypoint), its env (the runner's contract, merged into the
job's env), task_count 1 and the timeout (max_runtime_s plus grace, a backstop: the control plane
stops the execution itself). The image, cpu and memory are the job's and cannot be overridden
per execution: a resource class maps onto a job, not onto a shape chosen per task.

How it maps the core's contract onto Cloud Run:

* launch = RunJob. Its long-running operation ends only when the execution does, so the
  execution's name is read from the operation's metadata and the operation is never waited on.
  RunJob is NOT idempotent: a 5xx may come after the execution was created. So a launch is never
  retried in place (only a 429, which the service refused before doing anything); the control
  plane's launch retry looks the execution up with `find` first, and after such a failure `find`
  takes an empty list as "not listed yet" for `LIST_LAG_S` before it answers "not launched".
  On a job's first use its maxRetries is read (GetJob): a job that would run a failed task again
  (Cloud Run's default is 3) is refused with LAUNCH_FAILED, as a rerun runs the tool twice.
* find = list the job's executions and match the attempt's own marker, `CONTROLPLANE_JOB_NAME`
  in the execution's container env (overrides are applied to the execution's template).
* poll: there is no batch get and no state filter, so `poll_key` is the job: the reconciler
  hands over every watched execution of one job at once, answered by one paged ListExecutions
  (newest first, stopping once every watched execution was seen; one short page when they are
  where the last poll found them, the newest as a rule). An execution missing from the
  list is confirmed with one GetExecution before it is called GONE (Cloud Run keeps 1,000
  executions per job; a list is not proof of absence).
* cancel = CancelExecution, idempotent: an execution that has already ended (or vanished)
  answers as cancelled; the control plane repeats it until the execution reports it stopped.
* logs = Cloud Logging entries of the execution, one entries.list call a page, within Cloud
  Logging's read quota (`gcp/cloud_logging.py`). log_link = the execution's `log_uri`.

The handle (`CloudRunHandle`) is the execution's name with its job's, the start time, the
execution's log_uri and the waiting policy.

Scratch disk: refused. A RunJob override carries only the containers' args and env, the task
count and the timeout (no resources, no volumes), so an execution cannot be given disk. The
container's own writable filesystem is in memory (it counts against the job's memory), an
in-memory volume's size limit allocates nothing beyond that memory, and an ephemeral disk is a
setting of the job that the Admin API client this provider uses (run_v2) does not show. A task
that asks for `resources.scratch_mb` is refused at submit (and a launch that asks anyway is
refused); a tool that needs disk belongs on a job the operator gave an ephemeral disk, with the
need stated in the catalog's documentation rather than promised per task.

Settings (`CONTROLPLANE_CLOUD_RUN_*`), each endpoint and credential replaceable for emulators,
fakes and private endpoints: `ENDPOINT` (Admin API, e.g. `http://127.0.0.1:8080`),
`LOGGING_ENDPOINT`, `CREDENTIALS_FILE` (a service-account key; default Application Default
Credentials, the runtime service account on Cloud Run), `ANONYMOUS` (no credentials: fakes),
`MAX_TPS` (Admin API requests a second per project and region, shared by every client in the
process), `LOG_READS_PER_MIN`, `POLL_INTERVAL_S`, `PAGE_SIZE`, `STUCK_AFTER_S`, `RETRY_DEADLINE_S`,
`LIST_LAG_S`.

Errors (`gcp/admin.py`): 429 and 5xx are retried with jittered backoff inside each call (each
try holds a place in the limiter) and, past the deadline, become TransientProviderError, which
never fails a task. A 429 RESOURCE_EXHAUSTED whose ErrorInfo reason is RESOURCE_QUOTA_EXCEEDED
(an allocation quota: running executions, a region's CPU or memory) is a CapacityProviderError
at once, RunJob's included (refused before anything was created). A job that does not exist
fails the launch (PermanentProviderError -> LAUNCH_FAILED) with a message naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import run_v2
from google.protobuf import duration_pb2

from controlplane_providers import ratelimit
from controlplane_providers.base import (
    Capability,
    Handle,
    JobPhase,
    JobStatus,
    LaunchSpec,
    LogPage,
    PermanentProviderError,
    Provider,
    ProviderContext,
    Shape,
    TransientProviderError,
)
from controlplane_providers.gcp import admin
from controlplane_providers.gcp.cloud_logging import LogReader
from controlplane_providers.gcp.executions import MARKER, PHASES, execution_status, marker, timestamp
from controlplane_providers.gcp.options import CloudRunOptions, CloudRunSettings, job_parts

__all__ = ["MARKER", "PHASES", "CloudRunHandle", "CloudRunOptions", "CloudRunProvider", "CloudRunSettings",
           "execution_status"]

log = logging.getLogger("controlplane.providers.cloud_run")
NO_SCRATCH = ("a Cloud Run execution cannot be given disk: RunJob overrides carry only args, env, the task count "
              "and the timeout, and the container's own filesystem is in memory (it counts against the job's memory)")

DEFAULT_MAX_RETRIES = 3  # a job's maxRetries when unset (google/cloud/run/v2/task_template.proto)


@dataclass(frozen=True)
class CloudRunHandle(Handle):
    """An execution: its full name and its job's (the poll key), and what polls, log reads and
    links need without asking Cloud Run again."""

    execution: str
    job: str  # projects/P/locations/R/jobs/J
    job_name: str
    created_at: float | None = None
    log_uri: str | None = None
    stuck_after_s: float | None = None  # None: the provider's setting
    on_stuck: str = "wait"


class CloudRunProvider(Provider[CloudRunHandle]):
    name = "cloud_run"
    own_stores = ("gs://",)  # by the identity its jobs run as
    Settings = CloudRunSettings
    Options = CloudRunOptions
    handle_type = CloudRunHandle
    poll_batch_size = 1_000_000  # a whole job's watched executions in one call (one paged list)
    capabilities = frozenset({Capability.LOGS, Capability.LOG_LINK})

    def __init__(self, settings: CloudRunSettings, context: ProviderContext):
        self.settings = settings
        self.poll_interval_s = settings.poll_interval_s
        self.kill_grace_s = context.kill_grace_s
        self.credentials = self._credentials(settings)
        options = ClientOptions(api_endpoint=settings.endpoint) if settings.endpoint else None
        self.jobs = run_v2.JobsClient(credentials=self.credentials, transport="rest", client_options=options)
        self.executions = run_v2.ExecutionsClient(credentials=self.credentials, transport="rest",
                                                  client_options=options)
        self._logs = LogReader(lambda: self.settings, self.credentials)
        self._log_uris: dict[str, str] = {}  # execution -> its log_uri, learnt from polls
        self._depth: dict[str, int] = {}  # job -> how far down its list the last poll found its oldest watched
        self._jobs_checked: set[str] = set()  # jobs whose retry setting was found safe
        self._unsure: dict[str, float] = {}  # job_name -> when its RunJob failed ambiguously (monotonic)

    @staticmethod
    def _credentials(settings: CloudRunSettings) -> Any:
        if settings.anonymous:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth leaves it untyped
        if settings.credentials_file:
            from google.oauth2 import service_account

            return service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(settings.credentials_file), scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return None  # the SDK's Application Default Credentials

    # ---- calls: one limiter per project and region, retries with jitter -------------------------
    def _limiter(self, job_path: str) -> ratelimit.SlidingWindowLimiter:
        project, region, _ = job_parts(job_path)
        return ratelimit.shared(ratelimit.key("cloudrun", account=project, region=region,
                                              endpoint=self.settings.endpoint), self.settings.max_tps)

    def _call(self, job_path: str, fn: Callable[..., Any], *, retry_on: tuple[type[BaseException], ...] = admin.TRANSIENT,
              **kwargs: Any) -> Any:
        """One Admin API call through the project's limiter (`gcp/admin.py`)."""
        return admin.call(self._limiter(job_path), fn, deadline_s=self.settings.retry_deadline_s, retry_on=retry_on,
                          **kwargs)

    # ---- launch / find --------------------------------------------------------------------------
    def _check_job(self, job_path: str) -> None:
        """On a job's first use: refuse one whose failed task Cloud Run would run again (its
        maxRetries, 3 when unset): a rerun runs the tool a second time for one attempt."""
        if job_path in self._jobs_checked:
            return
        try:
            job = self._call(job_path, self.jobs.get_job, name=job_path)
        except PermanentProviderError as e:
            if isinstance(e.__cause__, gexc.NotFound):
                raise PermanentProviderError(f"the Cloud Run job {job_path} does not exist (provider_options.job "
                                             "of the catalog names a job the operator has not created)") from None
            raise
        template = job.template.template
        retries = template.max_retries if "max_retries" in template else DEFAULT_MAX_RETRIES
        if retries != 0:
            raise PermanentProviderError(
                f"the Cloud Run job {job_path} reruns a failed task (maxRetries {retries}"
                f"{'' if 'max_retries' in template else ', unset: Cloud Run defaults to 3'}), which would run the "
                "tool again for the same attempt; set it to 0 (gcloud run jobs update JOB --max-retries 0) and "
                "let the catalog's retry policy decide")
        self._jobs_checked.add(job_path)

    def launch(self, spec: LaunchSpec) -> CloudRunHandle:
        opts: CloudRunOptions = spec.options
        if spec.scratch_mb:
            raise PermanentProviderError(f"scratch_mb={spec.scratch_mb}: {NO_SCRATCH}")
        self._check_job(opts.job_path)
        override = run_v2.RunJobRequest.Overrides.ContainerOverride(
            name=opts.container or "", args=list(spec.command),
            env=[run_v2.EnvVar(name=k, value=v) for k, v in sorted(spec.env.items())])
        timeout = max(60, int(spec.max_runtime_s + self.kill_grace_s + 60))  # a backstop
        request = run_v2.RunJobRequest(name=opts.job_path, overrides=run_v2.RunJobRequest.Overrides(
            container_overrides=[override], task_count=1, timeout=duration_pb2.Duration(seconds=timeout)))
        try:
            # Only a 429 is retried in place: the service refused it before doing anything. After a
            # 5xx the execution may exist; the control plane's retry calls `find` first.
            operation = self._call(opts.job_path, self.jobs.run_job, retry_on=(gexc.TooManyRequests,),
                                   request=request)
        except TransientProviderError as e:
            if not isinstance(e.__cause__, gexc.TooManyRequests):  # it may have run: `find` must look a while
                self._unsure[spec.job_name] = time.monotonic()
            raise
        except PermanentProviderError as e:
            if isinstance(e.__cause__, gexc.NotFound):
                raise PermanentProviderError(f"the Cloud Run job {opts.job_path} does not exist (provider_options.job "
                                             "of the catalog names a job the operator has not created)") from None
            raise
        execution = operation.metadata
        if execution is None or not execution.name:
            # The operation has no execution yet: look it up by its marker rather than guess.
            self._unsure[spec.job_name] = time.monotonic()
            found = self.find(spec)
            if found is None:
                raise TransientProviderError("RunJob answered without an execution name")
            return found
        self._unsure.pop(spec.job_name, None)
        return self._handle(execution, spec)

    def _handle(self, execution: Any, spec: LaunchSpec) -> CloudRunHandle:
        opts: CloudRunOptions = spec.options
        return CloudRunHandle(execution=execution.name, job=opts.job_path, job_name=spec.job_name,
                              created_at=timestamp(execution.create_time) or time.time(), log_uri=execution.log_uri or None,
                              stuck_after_s=float(opts.stuck_after_s or self.settings.stuck_after_s),
                              on_stuck=opts.on_stuck)

    def find(self, spec: LaunchSpec) -> CloudRunHandle | None:
        """The attempt's execution, by its marker. After a RunJob of this attempt failed in a way
        that may have started it, an empty list is not proof: ListExecutions can lag behind the
        execution it created, so for `list_lag_s` after that failure an empty look raises
        TransientProviderError (look again later) instead of answering None (launch again)."""
        found = self.find_all(spec)
        if not found:
            unsure = self._unsure.get(spec.job_name)
            if unsure is not None and time.monotonic() - unsure < self.settings.list_lag_s:
                raise TransientProviderError(f"{spec.job_name}: RunJob failed after it may have created the execution, "
                                             "which Cloud Run does not list yet; looking again before launching again")
            self._unsure.pop(spec.job_name, None)
            return None
        self._unsure.pop(spec.job_name, None)
        if len(found) > 1:
            log.warning("%d Cloud Run executions carry %s; following the newest", len(found), spec.job_name)
        return found[0]

    def find_all(self, spec: LaunchSpec) -> list[CloudRunHandle]:
        """Every execution of the job that carries the attempt's marker, newest first (what the
        list shows now: no lag rule, unlike `find`)."""
        opts: CloudRunOptions = spec.options
        found = [ex for ex in self._list(opts.job_path) if marker(ex) == spec.job_name]
        found.sort(key=lambda ex: timestamp(ex.create_time) or 0, reverse=True)
        return [self._handle(ex, spec) for ex in found]

    def same_job(self, a: CloudRunHandle, b: CloudRunHandle) -> bool:
        return a.execution == b.execution

    def _list(self, job_path: str, until: Callable[[set[str]], bool] | None = None,
              page_size: int | None = None) -> list[Any]:
        """The job's executions, newest first, page by page of `page_size` (the setting's by
        default; stops early once `until(names seen)` holds)."""
        out: list[Any] = []
        token = ""
        while True:
            request = run_v2.ListExecutionsRequest(parent=job_path, page_size=page_size or self.settings.page_size,
                                                   page_token=token)
            pager = self._call(job_path, self.executions.list_executions, request=request)
            response = next(iter(pager.pages))  # this page only: each further page is one more counted call
            out.extend(response.executions)
            token = response.next_page_token
            if not token or (until is not None and until({ex.name for ex in out})):
                return out

    def _list_watched(self, job_path: str, wanted: set[str]) -> list[Any]:
        """The job's executions down to the oldest of `wanted`: one short page when they are where
        the last poll found them (the newest, as a rule: a page of the whole setting would fetch
        and parse every execution the job keeps, each poll), else the full listing again, from the
        top (a listing keeps one page size throughout, as the API asks)."""
        size = min(self.settings.page_size, max(2 * len(wanted), self._depth.get(job_path, 0)) + 20)
        listed: list[Any] = []
        if size < self.settings.page_size:
            listed = self._list(job_path, until=lambda _seen: True, page_size=size)
        whole = 0 < len(listed) < size  # a short page is the whole list
        if not whole and not wanted.issubset({ex.name for ex in listed}):
            listed = self._list(job_path, until=wanted.issubset)
        self._depth[job_path] = max((i + 1 for i, ex in enumerate(listed) if ex.name in wanted), default=0)
        return listed

    # ---- poll -----------------------------------------------------------------------------------
    def poll_key(self, handle: CloudRunHandle) -> Hashable:
        return handle.job

    def poll(self, handles: list[CloudRunHandle]) -> list[JobStatus]:
        if not handles:
            return []
        now = time.time()
        by_job: dict[str, list[CloudRunHandle]] = {}
        for h in handles:
            by_job.setdefault(h.job, []).append(h)
        seen: dict[str, Any] = {}
        for job_path, group in by_job.items():
            wanted = {h.execution for h in group}
            listed = self._list_watched(job_path, wanted)
            seen.update((ex.name, ex) for ex in listed if ex.name in wanted)
            for name in wanted - seen.keys():  # not listed: confirm before calling it gone
                try:
                    seen[name] = self._call(job_path, self.executions.get_execution, name=name)
                except PermanentProviderError as e:
                    if not isinstance(e.__cause__, gexc.NotFound):
                        raise
        out = []
        for h in handles:
            ex = seen.get(h.execution)
            if ex is None:
                self._log_uris.pop(h.execution, None)
                out.append(JobStatus(JobPhase.GONE, reason="Cloud Run no longer knows this execution",
                                     raw_status="GONE"))
                continue
            if ex.log_uri:
                self._log_uris[ex.name] = ex.log_uri
            out.append(execution_status(ex, now, h.stuck_after_s or self.settings.stuck_after_s, h.on_stuck))
        return out

    # ---- cancel ---------------------------------------------------------------------------------
    def cancel(self, handle: CloudRunHandle, reason: str = "cancelled") -> None:
        try:
            self._call(handle.job, self.executions.cancel_execution, name=handle.execution)
        except PermanentProviderError as e:
            # Already ended (FAILED_PRECONDITION) or gone (NOT_FOUND): nothing left to stop.
            if not isinstance(e.__cause__, gexc.NotFound | gexc.FailedPrecondition):
                raise

    def logs(self, handle: CloudRunHandle, cursor: str | None, limit: int) -> LogPage:
        return self._logs.page(handle.execution, handle.job, handle.created_at, cursor, limit)

    def price_region(self, options: CloudRunOptions) -> str | None:
        return job_parts(options.job_path)[1]

    def log_link(self, handle: CloudRunHandle) -> str | None:
        uri = handle.log_uri or self._log_uris.get(handle.execution)
        if uri:
            return uri
        project, region, _ = job_parts(handle.job)
        execution = handle.execution.rsplit("/", 1)[-1]
        return (f"https://console.cloud.google.com/run/jobs/executions/details/{region}/{execution}/logs"
                f"?project={project}")

    def scratch_note(self, shape: Shape) -> str:
        return NO_SCRATCH

