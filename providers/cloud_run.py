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
  (newest first, stopping once every watched execution was seen). An execution missing from the
  list is confirmed with one GetExecution before it is called GONE (Cloud Run keeps 1,000
  executions per job; a list is not proof of absence).
* cancel = CancelExecution, idempotent: an execution that has already ended (or vanished)
  answers as cancelled; the control plane repeats it until the execution reports it stopped.
* logs = Cloud Logging entries of the execution (resource `cloud_run_job`, label
  `run.googleapis.com/execution_name`), oldest first, cursor = timestamp (nanoseconds) +
  insertId, the service's own order, both in the query. One read is one entries.list call (an
  answer "search not finished" is continued by the next read at that cursor). Cloud Logging
  allows about 60 reads a minute per project: every HTTP request of the logging client takes a
  place in a per-project limiter without waiting (a tail over the quota answers "try again"
  with its cursor), and
  concurrent tails of one task share pages for a few seconds. Entries reach Cloud Logging with a
  delay of seconds (a line that arrives later with an earlier timestamp than the cursor is not
  seen by this tail); the runner's relay (the default log source) has every line, including
  those of a container that died before its log agent flushed. log_link = the execution's
  `log_uri`.

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

Errors: 429 and 5xx are retried with jittered backoff inside each call (each try holds a place
in the limiter) and, past the deadline, become TransientProviderError, which never fails a task.
A job that does not exist fails the launch (PermanentProviderError -> LAUNCH_FAILED) with a
message naming it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import run_v2
from google.protobuf import duration_pb2
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

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

log = logging.getLogger("controlplane.providers.cloud_run")
LOGGING_SCOPE = "https://www.googleapis.com/auth/logging.read"
NO_SCRATCH = ("a Cloud Run execution cannot be given disk: RunJob overrides carry only args, env, the task count "
              "and the timeout, and the container's own filesystem is in memory (it counts against the job's memory)")

MARKER = "CONTROLPLANE_JOB_NAME"  # the env var that names an execution's task attempt
DEFAULT_MAX_RETRIES = 3  # a job's maxRetries when unset (google/cloud/run/v2/task_template.proto)
_COND = run_v2.Condition.State
_REASON = run_v2.Condition.ExecutionReason
# The Completed condition (state, execution reason) -> our phase and the status word we show.
# An execution without a final Completed condition is RUNNING while a task runs or once one has
# run (its tasks may have ended while Completed is still reconciling), else PENDING.
PHASES: dict[tuple[int, int | None], tuple[JobPhase, str]] = {
    (_COND.CONDITION_SUCCEEDED, None): (JobPhase.SUCCEEDED, "SUCCEEDED"),
    (_COND.CONDITION_FAILED, _REASON.NON_ZERO_EXIT_CODE): (JobPhase.FAILED, "FAILED"),
    (_COND.CONDITION_FAILED, _REASON.CANCELLED): (JobPhase.FAILED, "CANCELLED"),
    (_COND.CONDITION_FAILED, _REASON.DELETED): (JobPhase.GONE, "DELETED"),
    (_COND.CONDITION_FAILED, None): (JobPhase.FAILED, "FAILED"),
}
TRANSIENT = (gexc.TooManyRequests, gexc.ServiceUnavailable, gexc.InternalServerError, gexc.BadGateway,
             gexc.GatewayTimeout, gexc.DeadlineExceeded, requests.exceptions.ConnectionError,
             requests.exceptions.Timeout)


class CloudRunSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_CLOUD_RUN_", extra="ignore")

    endpoint: str | None = None  # Cloud Run Admin API base URL (default run.googleapis.com)
    logging_endpoint: str | None = None  # Cloud Logging API base URL (default logging.googleapis.com)
    credentials_file: Path | None = None  # a service-account key; default: Application Default Credentials
    anonymous: bool = False  # send no credentials (emulators and fakes only)
    max_tps: float = Field(default=10.0, gt=0)  # Admin API requests per second, per project and region
    log_reads_per_min: int = Field(default=60, ge=1)  # Cloud Logging entries.list, per project
    poll_interval_s: float = Field(default=10.0, gt=0)
    page_size: int = Field(default=500, ge=1, le=1000)  # executions per ListExecutions page
    stuck_after_s: float = Field(default=900.0, gt=0)
    retry_deadline_s: float = Field(default=30.0, ge=0)  # how long one call retries 429/5xx
    list_lag_s: float = Field(default=60.0, ge=0)  # after an ambiguous RunJob, how long `find` keeps looking


class CloudRunOptions(WaitPolicy):
    job: str = Field(min_length=1)
    project: str | None = None
    region: str | None = None
    container: str | None = None

    @model_validator(mode="after")
    def _located(self) -> CloudRunOptions:
        if self.job.startswith("projects/"):
            parts = self.job.split("/")
            if len(parts) != 6 or parts[2] != "locations" or parts[4] != "jobs" or not all(parts[1::2]):
                raise ValueError("job: a full name is projects/PROJECT/locations/REGION/jobs/JOB")
        elif "/" in self.job:
            raise ValueError("job: a job name, or projects/PROJECT/locations/REGION/jobs/JOB")
        elif not (self.project and self.region):
            raise ValueError("project: project and region are required with a short job name")
        return self

    @property
    def job_path(self) -> str:
        return self.job if self.job.startswith("projects/") else \
            f"projects/{self.project}/locations/{self.region}/jobs/{self.job}"


def _ts(t: Any) -> float | None:
    """A proto timestamp (DatetimeWithNanoseconds, or unset) as epoch seconds."""
    if t is None:
        return None
    if isinstance(t, datetime):
        return t.timestamp() if t.year > 1970 else None
    return None


def _rfc3339(t: datetime | float) -> str:
    """A UTC instant in the one form cursors and filters use (microseconds, Z): equal instants
    give equal strings and the strings sort as the instants do."""
    dt = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parts(job_path: str) -> tuple[str, str, str]:
    """(project, region, job) of projects/P/locations/R/jobs/J."""
    _, project, _, region, _, job = job_path.split("/")
    return project, region, job


def execution_status(ex: Any, now: float, stuck_after_s: float, on_stuck: str) -> JobStatus:
    """One execution as the core's job status, through the table above. Before Completed is
    final: RUNNING while a task runs or once one has run (ENDING: its tasks ended, the
    condition is still reconciling), else PENDING, aged from the execution's creation."""
    completed = next((c for c in ex.conditions if c.type_ == "Completed"), None)
    state = int(completed.state) if completed is not None else _COND.CONDITION_PENDING
    reason_code = int(completed.execution_reason) if completed is not None else 0
    message = completed.message if completed is not None else ""
    started, finished = _ts(ex.start_time), _ts(ex.completion_time)
    if state in (_COND.CONDITION_SUCCEEDED, _COND.CONDITION_FAILED):
        phase, word = PHASES.get((state, reason_code)) or PHASES[(state, None)]
        why = _REASON(reason_code).name if reason_code else None
        reason = ": ".join(p for p in (why, message) if p) or None
        return JobStatus(phase, reason=reason, started_at=started, finished_at=finished, raw_status=word)
    if ex.running_count > 0 or reason_code == _REASON.CANCELLING:
        word = "CANCELLING" if reason_code == _REASON.CANCELLING else "RUNNING"
        return JobStatus(JobPhase.RUNNING, reason=message or None, started_at=started or now, raw_status=word)
    if ex.succeeded_count or ex.failed_count or ex.cancelled_count or started:
        # Its tasks ran (and, with none running, ended) while Completed is still reconciling:
        # the execution is ending, not waiting to start.
        ended = bool(ex.succeeded_count or ex.failed_count or ex.cancelled_count)
        return JobStatus(JobPhase.RUNNING, reason=message or None, started_at=started or now,
                         raw_status="ENDING" if ended else "RUNNING")
    waiting, give_up = waiting_verdict("PENDING", now - (_ts(ex.create_time) or now),
                                       message or "waiting for the execution to start",
                                       stuck_after_s=stuck_after_s, on_stuck=on_stuck, noun="execution")
    return JobStatus(JobPhase.PENDING, reason=message or None, waiting_reason=waiting, give_up_reason=give_up,
                     raw_status="PENDING")


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
        self._logging: dict[str, Any] = {}  # project -> its Cloud Logging client
        self._logging_lock = threading.Lock()
        self._pages = logtail.SharedPages()
        self._log_uris: dict[str, str] = {}  # execution -> its log_uri, learnt from polls
        self._searches: dict[tuple[str, str, int], str] = {}  # (execution, cursor, size) -> an unfinished search's token
        self._jobs_checked: set[str] = set()  # jobs whose retry setting was found safe
        self._unsure: dict[str, float] = {}  # job_name -> when its RunJob failed ambiguously (monotonic)

    @staticmethod
    def _credentials(settings: CloudRunSettings) -> Any:
        if settings.anonymous:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        if settings.credentials_file:
            from google.oauth2 import service_account

            return service_account.Credentials.from_service_account_file(
                str(settings.credentials_file), scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return None  # the SDK's Application Default Credentials

    # ---- calls: one limiter per project and region, retries with jitter -------------------------
    def _limiter(self, job_path: str) -> ratelimit.SlidingWindowLimiter:
        project, region, _ = _parts(job_path)
        return ratelimit.shared(ratelimit.key("cloudrun", account=project, region=region,
                                              endpoint=self.settings.endpoint), self.settings.max_tps)

    def _call(self, job_path: str, fn: Callable[..., Any], *, retry_on: tuple[type[BaseException], ...] = TRANSIENT,
              **kwargs: Any) -> Any:
        """One Admin API call. The SDK's own retries are off (`retry=None`) so that every try
        passes the shared limiter; 429/5xx are retried here until `retry_deadline_s`."""
        limiter = self._limiter(job_path)

        def once() -> Any:
            with ratelimit.held(limiter):
                return fn(**kwargs, retry=None, timeout=30)

        try:
            for attempt in Retrying(retry=retry_if_exception(lambda e: isinstance(e, retry_on)),
                                    wait=wait_random_exponential(multiplier=0.25, max=8),
                                    stop=stop_after_delay(self.settings.retry_deadline_s) | stop_after_attempt(10),
                                    reraise=True):
                with attempt:
                    return once()
        except TRANSIENT as e:
            raise TransientProviderError(f"Cloud Run API: {type(e).__name__}: {getattr(e, 'message', e)}") from e
        except gexc.GoogleAPICallError as e:
            raise PermanentProviderError(f"Cloud Run API: {type(e).__name__}: {e.message}") from e
        return None  # pragma: no cover

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
                              created_at=_ts(execution.create_time) or time.time(), log_uri=execution.log_uri or None,
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
        found = [ex for ex in self._list(opts.job_path) if _marker(ex) == spec.job_name]
        found.sort(key=lambda ex: _ts(ex.create_time) or 0, reverse=True)
        return [self._handle(ex, spec) for ex in found]

    def same_job(self, a: CloudRunHandle, b: CloudRunHandle) -> bool:
        return a.execution == b.execution

    def _list(self, job_path: str, until: Callable[[Any], bool] | None = None) -> list[Any]:
        """The job's executions, newest first, page by page (stops early once `until` is true)."""
        out: list[Any] = []
        token = ""
        while True:
            request = run_v2.ListExecutionsRequest(parent=job_path, page_size=self.settings.page_size, page_token=token)
            pager = self._call(job_path, self.executions.list_executions, request=request)
            response = next(iter(pager.pages))  # this page only: each further page is one more counted call
            out.extend(response.executions)
            token = response.next_page_token
            if not token or (until is not None and until(out)):
                return out

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
            listed = self._list(job_path, until=lambda out, w=wanted: w <= {ex.name for ex in out})
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

    # ---- logs -----------------------------------------------------------------------------------
    def _log_limiter(self, project: str) -> ratelimit.SlidingWindowLimiter:
        return ratelimit.shared(ratelimit.key("logging", account=project, endpoint=self.settings.logging_endpoint),
                                self.settings.log_reads_per_min, window_s=60.0)

    def _logging_client(self, project: str) -> Any:
        """The project's Cloud Logging client, whose every HTTP request takes a place in the
        project's read limiter without waiting (ratelimit.OverQuota when none is free)."""
        with self._logging_lock:
            client = self._logging.get(project)
            if client is None:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession
                from google.cloud import logging as gcl

                credentials = self.credentials or google.auth.default(scopes=[LOGGING_SCOPE])[0]
                session = ratelimit.limit_session(AuthorizedSession(credentials), lambda: self._log_limiter(project))
                options = {"api_endpoint": self.settings.logging_endpoint} if self.settings.logging_endpoint else None
                client = self._logging[project] = gcl.Client(project=project, credentials=credentials, _http=session,
                                                             _use_grpc=False, client_options=options)
            return client

    def logs(self, handle: CloudRunHandle, cursor: str | None, limit: int) -> LogPage:
        return self._pages.get((handle.execution, cursor, limit), lambda: self._read_logs(handle, cursor, limit))

    def _read_logs(self, handle: CloudRunHandle, cursor: str | None, limit: int) -> LogPage:
        """One page: one entries.list call, from the cursor (the last entry returned: its
        timestamp to the nanosecond and its insertId, the service's own order) on."""
        project, region, job = _parts(handle.job)
        execution = handle.execution.rsplit("/", 1)[-1]
        try:
            after = _log_cursor(cursor)
        except ValueError:
            return LogPage([], cursor, reason="malformed cursor: pass the next_cursor of a previous answer")
        terms = [
            'resource.type = "cloud_run_job"',
            f'resource.labels.job_name = "{job}"',
            f'resource.labels.location = "{region}"',
            f'labels."run.googleapis.com/execution_name" = "{execution}"',
        ]
        if after is None:
            # Always bound by time: without a timestamp term Cloud Logging searches the last 24 h only.
            terms.append(f'timestamp >= "{_ns_text(_rfc3339((handle.created_at or time.time()) - 60))}"')
        else:
            ts, insert_id = after
            terms.append(f'timestamp >= "{ts}"')
            terms.append(f'(timestamp > "{ts}" OR insertId > {_quoted(insert_id)})')
        body: dict[str, Any] = {"resourceNames": [f"projects/{project}"], "filter": "\n".join(terms),
                                "orderBy": "timestamp asc", "pageSize": limit}
        search = (handle.execution, cursor or "", limit)
        token = self._searches.pop(search, None)
        if token:
            body["pageToken"] = token  # the same request, continuing a search that had not finished
        try:
            # The SDK's list_entries pager reads the next page before it looks at max_results (one
            # more call a read) and gives timestamps to the microsecond; its connection sends one
            # request, and answers the entries as the service wrote them.
            answer = self._logging_client(project)._connection.api_request(method="POST", path="/entries:list",
                                                                          data=body)
        except ratelimit.OverQuota as e:
            return logtail.over_quota(cursor, f"Cloud Logging allows {self.settings.log_reads_per_min} reads a "
                                      "minute per project", e.wait_s)
        except TRANSIENT as e:
            raise TransientProviderError(f"Cloud Logging: {type(e).__name__}") from e
        except gexc.GoogleAPICallError as e:
            raise PermanentProviderError(f"Cloud Logging: {e.message}") from e
        entries = answer.get("entries") or []
        if not entries and answer.get("nextPageToken"):
            self._searches[search] = answer["nextPageToken"]
            return LogPage([], cursor, reason="Cloud Logging has not finished searching; ask again to continue")
        keyed = []
        for e in entries:
            try:
                ts = _ns_text(e["timestamp"])
            except (KeyError, ValueError):
                continue  # the service stamps every entry; one it did not cannot be placed
            keyed.append(((ts, e.get("insertId") or ""), LogLine(ts=_epoch(ts), message=_entry_text(e))))
        page = logtail.after_cursor(keyed, None if after is None else f"{after[0]}|{after[1]}", limit)
        return LogPage(page.lines, page.next_cursor if page.lines else cursor)

    def price_region(self, options: CloudRunOptions) -> str | None:
        return _parts(options.job_path)[1]

    def log_link(self, handle: CloudRunHandle) -> str | None:
        uri = handle.log_uri or self._log_uris.get(handle.execution)
        if uri:
            return uri
        project, region, _ = _parts(handle.job)
        execution = handle.execution.rsplit("/", 1)[-1]
        return (f"https://console.cloud.google.com/run/jobs/executions/details/{region}/{execution}/logs"
                f"?project={project}")

    def scratch_note(self, shape: Shape) -> str:
        return NO_SCRATCH


def _marker(execution: Any) -> str | None:
    for container in execution.template.containers:
        for env in container.env:
            if env.name == MARKER:
                return env.value
    return None


def _entry_text(entry: dict[str, Any]) -> str:
    """A LogEntry's line: its textPayload, or its jsonPayload's message (else the whole payload)."""
    if "textPayload" in entry:
        return str(entry["textPayload"]).rstrip("\n")
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict):
        return str(payload.get("message") or payload)
    return "" if payload is None else str(payload)


_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def _ns_text(text: str) -> str:
    """An RFC3339 timestamp as UTC with nine fractional digits and Z: the fixed-width form that
    sorts as the instants do. (proto3 JSON writes 0, 3, 6 or 9 digits.)"""
    m = _TIMESTAMP.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not an RFC3339 timestamp: {text!r}")
    base, frac, zone = m.groups()
    if zone != "Z":
        base = datetime.fromisoformat(base + zone).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{(frac or '').ljust(9, '0')}Z"


def _epoch(ns_text: str) -> float:
    """Epoch seconds of a `_ns_text` timestamp (for display; cursors keep the text)."""
    return datetime.fromisoformat(ns_text[:19] + "+00:00").timestamp() + int(ns_text[20:29]) / 1e9


def _quoted(text: str) -> str:
    """A string value of the Logging query language."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _log_cursor(cursor: str | None) -> tuple[str, str] | None:
    """(timestamp, insertId) of a log cursor, the timestamp in `_ns_text` form (cursors written
    before nanoseconds were kept carry six digits); None for the start; ValueError if malformed."""
    if not cursor:
        return None
    ts, sep, insert_id = cursor.partition("|")
    if not sep:
        raise ValueError("no insertId")
    return _ns_text(ts), insert_id
