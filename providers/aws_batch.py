"""AWS Batch: each task attempt is one Batch job; its logs are in CloudWatch Logs.

Catalog options (on the resource class or the tool, `provider_options`):

    job_queue       the Batch job queue (required)
    job_definition  the job definition (name, name:revision or ARN; required); its image's
                    entrypoint is the runner (`infra/runner/Dockerfile`)
    log_group       CloudWatch log group of the job's output (default /aws/batch/job)
    stuck_after_s   a job still RUNNABLE or STARTING after this long is reported as stuck
    on_stuck        "wait" (default: keep waiting, with the reason in get_task_status) or
                    "fail" (stop the job and fail the attempt with LAUNCH_FAILED)

How it maps the core's contract onto Batch:

* launch = SubmitJob, named after the task and attempt, with the tool's command and the
  runner's environment as container overrides, resourceRequirements from the resource class,
  attemptDurationSeconds as a backstop for max_runtime_s, tags (task, tool, owner) propagated
  to the ECS task, and Batch's own retries off (the control plane owns retries).
* SubmitJob is not idempotent. The control plane records its intent first; after a crash
  `find` looks the job up with ListJobs filtered by JOB_NAME (always with a filter: without a
  status or filter the real API lists RUNNING jobs only) before anything is submitted again.
  For the same reason SubmitJob is retried in place only when it was throttled (the service
  refused it before doing anything). botocore's retries would repeat it after a 5xx or a lost
  answer too, when the job may exist, and submit it twice; so it goes through a client of its own
  with botocore's retries off, and such a failure is a TransientProviderError, after which the
  control plane calls `find` before it submits again.
* poll = DescribeJobs, at most 100 ids a call (the API's limit). A job Batch no longer returns
  is GONE. The exit code comes from the container, or from the last attempt's.
* cancel = TerminateJob with a reason, in any state; idempotent.
* logs = GetLogEvents on the job's stream (`container.logStreamName`, or the last attempt's
  for finished jobs); the cursor is CloudWatch's forward token. A stream that does not exist
  (yet) is an empty page with a reason.
* The handle (`BatchHandle`) is the job id with its name, queue, log group and waiting policy.

Scratch disk is the job definition's, never the submit's (SubmitJob cannot change it): a Fargate
job definition's `ephemeralStorage` (20 GiB when unset), none on EC2 resources. `scratch_limit_mb`
reads the job definition (`aws/storage.py`, cached a minute) and `launch` checks it again.

No capacity error at launch: SubmitJob answers only ClientException and ServerException, and a
queue whose compute environments cannot scale takes the job and leaves it RUNNABLE, which `poll`
reports as waiting and gives up on per `on_stuck` (`aws/errors.py`).

Settings (`CONTROLPLANE_AWS_BATCH_*`): `REGION` (else boto3's chain), `ENDPOINT_URL` (an emulator
or a private endpoint; boto3's own `AWS_ENDPOINT_URL_BATCH` works too), `LOGS_ENDPOINT_URL`,
`MAX_TPS`, `POLL_INTERVAL_S`, `STUCK_AFTER_S`. Credentials: boto3's standard chain.

Throttling: botocore's adaptive retries, and a limiter shared by every Batch client of one
account and region in the process (default 40 requests/s, under Batch's documented 50 TPS for
SubmitJob and DescribeJobs). It counts every HTTP request, retries included, because it hooks
into botocore's request events rather than wrapping the API methods, and it bounds what Batch
sees in any second, requests in flight included (see `providers/ratelimit.py`). A 429 or 5xx that
outlasts the retries is a TransientProviderError: it never fails a task by itself.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field
from pydantic_settings import SettingsConfigDict
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from controlplane_providers import logtail, ratelimit
from controlplane_providers.aws.errors import classify, throttled
from controlplane_providers.aws.storage import Storage, read_definition, storage_of
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

log = logging.getLogger("controlplane.providers.aws_batch")

DEFAULT_LOG_GROUP = "/aws/batch/job"
DEFINITION_TTL_S = 60.0  # how long a job definition's facts are trusted before they are read again
# Batch status -> the core's job phase: the one table.
PHASES: dict[str, JobPhase] = {
    "SUBMITTED": JobPhase.PENDING,
    "PENDING": JobPhase.PENDING,
    "RUNNABLE": JobPhase.PENDING,
    "STARTING": JobPhase.PENDING,
    "RUNNING": JobPhase.RUNNING,
    "SUCCEEDED": JobPhase.SUCCEEDED,
    "FAILED": JobPhase.FAILED,
}
WAITING = {"RUNNABLE": "waiting for compute capacity", "STARTING": "starting its container"}
_TAG_VALUE = re.compile(r"[^\w .:/=+\-@]")


def _tag(value: str) -> str:
    return _TAG_VALUE.sub("_", value)[:256]


class AwsBatchSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_AWS_BATCH_", extra="ignore")

    region: str | None = None
    endpoint_url: str | None = None
    logs_endpoint_url: str | None = None
    max_tps: float = Field(default=40.0, gt=0)  # all Batch calls of this process, per account and region
    poll_interval_s: float = Field(default=10.0, gt=0)
    stuck_after_s: float = Field(default=900.0, gt=0)  # RUNNABLE/STARTING longer than this is "stuck"
    # CloudWatch Logs GetLogEvents of this process, per account and region (AWS allows 25 a second
    # per account and region, shared with everything else that reads the account's logs).
    log_reads_per_min: int = Field(default=600, ge=1)


class AwsBatchOptions(WaitPolicy):
    job_queue: str = Field(min_length=1)
    job_definition: str = Field(min_length=1)
    log_group: str = DEFAULT_LOG_GROUP


@dataclass(frozen=True)
class BatchHandle(Handle):
    """A Batch job: its id, and what polls and log reads need without asking Batch again."""

    job_id: str
    job_name: str
    job_queue: str
    log_group: str = DEFAULT_LOG_GROUP
    stuck_after_s: float | None = None  # None: the provider's setting
    on_stuck: str = "wait"


class AwsBatchProvider(Provider[BatchHandle]):
    name = "aws_batch"
    own_stores = ("s3://",)  # by the identity its jobs run as
    stuck_is_no_room = True  # RUNNABLE past stuck_after_s: the queue's compute has no room
    Settings = AwsBatchSettings
    Options = AwsBatchOptions
    handle_type = BatchHandle
    poll_batch_size = 100  # DescribeJobs takes at most 100 job ids
    capabilities = frozenset({Capability.LOGS, Capability.LOG_LINK, Capability.SCRATCH})

    def __init__(self, settings: AwsBatchSettings, context: ProviderContext, *, session: Any = None):
        self.settings = settings
        session = session or boto3.session.Session(region_name=settings.region)
        config = Config(retries={"mode": "adaptive", "max_attempts": 8}, connect_timeout=10, read_timeout=30)
        self.batch = session.client("batch", config=config, endpoint_url=settings.endpoint_url)
        # SubmitJob only, with botocore's retries off: `_submit` retries a throttled one itself.
        once = config.merge(Config(retries={"mode": "standard", "total_max_attempts": 1}))
        self.submitter = session.client("batch", config=once, endpoint_url=settings.endpoint_url)
        # Log reads are not retried in place: a throttled or failed read is an empty page to ask again.
        self.logs_client = session.client("logs", config=once, endpoint_url=settings.logs_endpoint_url)
        self.region: str = self.batch.meta.region_name
        self.poll_interval_s = settings.poll_interval_s
        self.stuck_after_s = settings.stuck_after_s
        self.kill_grace_s = context.kill_grace_s
        # One limiter per account and region (and endpoint, for emulators), shared by all clients.
        self.limiter = ratelimit.shared(ratelimit.key("batch", region=self.region, endpoint=self.batch.meta.endpoint_url),
                                        settings.max_tps)
        for client in (self.batch, self.submitter):
            ratelimit.BotocoreHook(self.limiter).install(client, "batch")  # every request, retries too
        self._streams: dict[str, str] = {}  # job id -> log stream, learnt from DescribeJobs
        self._storage: dict[str, tuple[float, Storage]] = {}  # job definition -> (read at, its storage)
        self._storage_lock = threading.Lock()

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise classify(e) from e

    # ---- launch / find ------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> BatchHandle:
        opts: AwsBatchOptions = spec.options
        if spec.scratch_mb:
            storage = self._job_storage(opts.job_definition)
            if storage.limit_mb is None or spec.scratch_mb > storage.limit_mb:
                raise PermanentProviderError(f"the task asks for scratch_mb={spec.scratch_mb}; {storage.note}")
        requirements = [{"type": "VCPU", "value": f"{spec.cpu:g}"}, {"type": "MEMORY", "value": str(spec.memory_mb)}]
        if spec.gpu:
            requirements.append({"type": "GPU", "value": str(spec.gpu)})
        resp = self._submit(
            jobName=spec.job_name,
            jobQueue=opts.job_queue,
            jobDefinition=opts.job_definition,
            containerOverrides={
                "command": list(spec.command),
                "environment": [{"name": k, "value": v} for k, v in sorted(spec.env.items())],
                "resourceRequirements": requirements,
            },
            # A backstop: the control plane stops the job at max_runtime_s itself.
            timeout={"attemptDurationSeconds": max(60, int(spec.max_runtime_s + self.kill_grace_s + 60))},
            retryStrategy={"attempts": 1},
            tags={"controlplane:task": spec.task_id, "controlplane:attempt": str(spec.attempt),
                  "controlplane:tool": _tag(spec.tool_name), "controlplane:owner": _tag(spec.owner)},
            propagateTags=True,
        )
        return self._handle(resp["jobId"], spec)

    def _submit(self, **request: Any) -> dict[str, Any]:
        """SubmitJob, retried here only while it is throttled (see the module's doc)."""
        try:
            for attempt in Retrying(retry=retry_if_exception(throttled), wait=wait_random_exponential(multiplier=0.25, max=8),
                                    stop=stop_after_attempt(8), reraise=True):
                with attempt:
                    resp: dict[str, Any] = self.submitter.submit_job(**request)
                    return resp
        except (ClientError, BotoCoreError) as e:
            raise classify(e) from e
        raise AssertionError("unreachable")  # pragma: no cover

    def _handle(self, job_id: str, spec: LaunchSpec) -> BatchHandle:
        opts: AwsBatchOptions = spec.options
        return BatchHandle(job_id=job_id, job_name=spec.job_name, job_queue=opts.job_queue, log_group=opts.log_group,
                           stuck_after_s=float(opts.stuck_after_s or self.stuck_after_s), on_stuck=opts.on_stuck)

    def find(self, spec: LaunchSpec) -> BatchHandle | None:
        found = self.find_all(spec)
        if len(found) > 1:
            log.warning("%d Batch jobs are named %s; following the newest", len(found), spec.job_name)
        return found[0] if found else None

    def find_all(self, spec: LaunchSpec) -> list[BatchHandle]:
        """The Batch jobs of the attempt's name in its queue, newest first: ListJobs filtered by
        JOB_NAME, which lists jobs of every status (SUBMITTED to FAILED), page by page."""
        # A filter, never a bare listing: without a status or a filter ListJobs returns only
        # RUNNING jobs, and a job submitted just before a crash is SUBMITTED or RUNNABLE.
        found: list[dict[str, Any]] = []
        token = None
        while True:
            kwargs: dict[str, Any] = {"jobQueue": spec.options.job_queue,
                                      "filters": [{"name": "JOB_NAME", "values": [spec.job_name]}]}
            if token:
                kwargs["nextToken"] = token
            resp = self._call(self.batch.list_jobs, **kwargs)
            found += [j for j in resp.get("jobSummaryList", []) if j.get("jobName") == spec.job_name]
            token = resp.get("nextToken")
            if not token:
                break
        found.sort(key=lambda j: j.get("createdAt", 0), reverse=True)
        return [self._handle(j["jobId"], spec) for j in found]

    def same_job(self, a: BatchHandle, b: BatchHandle) -> bool:
        return a.job_id == b.job_id

    # ---- poll ---------------------------------------------------------------------------------
    def poll(self, handles: list[BatchHandle]) -> list[JobStatus]:
        if not handles:
            return []
        ids = [h.job_id for h in handles]
        jobs: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), self.poll_batch_size):
            resp = self._call(self.batch.describe_jobs, jobs=ids[i : i + self.poll_batch_size])
            for job in resp.get("jobs", []):
                jobs[job["jobId"]] = job
        now = time.time()
        return [self._status(h, jobs.get(h.job_id), now) for h in handles]

    def _status(self, h: BatchHandle, job: dict[str, Any] | None, now: float) -> JobStatus:
        if job is None:
            self._streams.pop(h.job_id, None)
            return JobStatus(JobPhase.GONE, reason="AWS Batch no longer knows this job", raw_status="GONE")
        status = job["status"]
        container = job.get("container") or {}
        last = (job.get("attempts") or [{}])[-1].get("container") or {}
        stream = container.get("logStreamName") or last.get("logStreamName")
        if stream:
            self._streams[h.job_id] = stream
        exit_code = container.get("exitCode", last.get("exitCode"))
        phase = PHASES.get(status, JobPhase.PENDING)
        waiting = give_up = None
        if status in WAITING:
            waiting, give_up = waiting_verdict(
                status, now - job.get("createdAt", now * 1000) / 1000, job.get("statusReason") or WAITING[status],
                stuck_after_s=h.stuck_after_s or self.stuck_after_s, on_stuck=h.on_stuck)
        return JobStatus(
            phase,
            reason=job.get("statusReason"),
            exit_code=exit_code,
            started_at=job["startedAt"] / 1000 if job.get("startedAt") else None,
            finished_at=job["stoppedAt"] / 1000 if job.get("stoppedAt") else None,
            waiting_reason=waiting,
            give_up_reason=give_up,
            raw_status=status,
        )

    # ---- cancel -------------------------------------------------------------------------------
    def cancel(self, handle: BatchHandle, reason: str = "cancelled") -> None:
        # TerminateJob stops a job in any state (CancelJob only before it starts).
        self._call(self.batch.terminate_job, jobId=handle.job_id, reason=f"controlplane: {reason}"[:1000])

    # ---- logs ---------------------------------------------------------------------------------
    def _stream(self, handle: BatchHandle) -> str | None:
        stream = self._streams.get(handle.job_id)
        if stream is None:
            self.poll([handle])
            stream = self._streams.get(handle.job_id)
        return stream

    def logs(self, handle: BatchHandle, cursor: str | None, limit: int) -> LogPage:
        stream = self._stream(handle)
        if not stream:
            return LogPage([], cursor, reason="the job has no log stream yet (it has not started)")
        kwargs: dict[str, Any] = {"logGroupName": handle.log_group,
                                  "logStreamName": stream, "startFromHead": True, "limit": max(1, min(limit, 10000))}
        if cursor:
            kwargs["nextToken"] = cursor
        quota = ratelimit.shared(ratelimit.key("logs", region=self.region, endpoint=self.logs_client.meta.endpoint_url),
                                 self.settings.log_reads_per_min, window_s=60.0)
        token = quota.try_acquire()
        if token is None:
            return logtail.over_quota(cursor, f"CloudWatch Logs reads are kept to {self.settings.log_reads_per_min} "
                                      "a minute per region", quota.wait_s())
        failed = True
        try:
            resp = self.logs_client.get_log_events(**kwargs)
            failed = False
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return LogPage([], cursor, reason=f"log stream {stream} does not exist (yet)")
            if throttled(e):
                return logtail.over_quota(cursor, "CloudWatch Logs throttled the read", 1.0)
            raise classify(e) from e
        except BotoCoreError as e:
            raise classify(e) from e
        finally:
            quota.release(token, failed=failed)
        lines = [LogLine(ts=ev["timestamp"] / 1000, message=ev["message"]) for ev in resp.get("events", [])]
        return LogPage(lines, resp.get("nextForwardToken") or cursor)

    def log_link(self, handle: BatchHandle) -> str | None:
        stream = self._streams.get(handle.job_id)
        group = handle.log_group

        def enc(s: str) -> str:  # the console's double encoding of path parts
            return quote(quote(s, safe=""), safe="").replace("%", "$")

        base = f"https://{self.region}.console.aws.amazon.com/cloudwatch/home?region={self.region}"
        if stream:
            return f"{base}#logsV2:log-groups/log-group/{enc(group)}/log-events/{enc(stream)}"
        return f"{base}#logsV2:log-groups/log-group/{enc(group)}"

    # ---- scratch disk: the job definition's ------------------------------------------------------
    def price_region(self, options: AwsBatchOptions) -> str | None:
        return self.region  # every job of this provider runs in its client's region

    def scratch_limit_mb(self, shape: Shape) -> int | None:
        return self._job_storage(shape.options.job_definition).limit_mb

    def scratch_note(self, shape: Shape) -> str:
        return self._job_storage(shape.options.job_definition).note

    def _job_storage(self, ref: str) -> Storage:
        """The scratch disk job definition `ref` gives a job, read at most once a minute (a stale
        answer is used while Batch is throttled or unavailable)."""
        now = time.monotonic()
        with self._storage_lock:
            known = self._storage.get(ref)
        if known is not None and now - known[0] < DEFINITION_TTL_S:
            return known[1]
        try:
            storage = storage_of(ref, read_definition(self._call, self.batch, ref))
        except TransientProviderError:
            if known is not None:
                return known[1]
            raise
        with self._storage_lock:
            self._storage[ref] = (now, storage)
        return storage
