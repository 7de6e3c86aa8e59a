"""The provider interface: how the control plane launches, watches, stops and reads one job.

A provider turns a `LaunchSpec` into a job on some runner (local processes, AWS Batch, Cloud Run
Jobs, Azure Container Apps Jobs) and answers questions about it later. The contract:

* `launch(spec) -> handle`. The handle is a small JSON-serialisable dict that the control plane
  stores in its database; every later call receives it back. A provider keeps no state in
  memory that it cannot rebuild from handles: the control plane restarts, handles survive.
* Launching is assumed NOT idempotent (Batch SubmitJob, Cloud Run RunJob are not). The control
  plane records its intent before calling `launch`, and after a crash it calls
  `find(spec)` to look the job up by `spec.job_name` (deterministic per task and attempt)
  before it launches again. A provider must name or tag its jobs so that `find` works.
* `poll(handles) -> statuses`, answered in the same order, in batches of at most
  `poll_batch_size` handles per call (the control plane never passes more). A job the runner
  no longer knows is `JobPhase.GONE`, never an exception.
* `cancel(handle)` asks the job to stop: idempotent, callable in any state, and safe to repeat;
  the control plane repeats it until `poll` reports the job stopped.
* `logs(handle, cursor, limit)` reads the runner's native log (CloudWatch, Cloud Logging, a
  local file) page by page; a log that does not exist (yet) is an empty page with a reason.
  `log_link(handle)` is a console URL for humans.
* Optional capabilities are declared in `capabilities`, never guessed by trying.
* Provider API errors: raise `TransientProviderError` for throttling/5xx/network trouble (the
  control plane retries with backoff and never fails a task for it) and
  `PermanentProviderError` when the request itself is wrong (bad job definition, quota
  refused); anything else is treated as transient.

Cloud SDKs are imported only inside their provider module, never by the core.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Handle = dict[str, Any]


class Capability(StrEnum):
    LOGS = "logs"  # logs(handle, cursor, limit) reads the native log
    LOG_LINK = "log_link"  # log_link(handle) returns a console URL
    FIND = "find"  # find(spec) looks a job up by name after a crash (required for cloud runners)


class JobPhase(StrEnum):
    PENDING = "pending"  # accepted, waiting for capacity or starting
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the runner exited 0
    FAILED = "failed"  # the runner exited non-zero, or the provider stopped it
    GONE = "gone"  # the provider does not know this job (any more)


@dataclass(frozen=True)
class LaunchSpec:
    task_id: str
    attempt: int
    job_name: str  # deterministic: controlplane.ids.job_name(task_id, attempt)
    tool_name: str
    owner: str
    command: tuple[str, ...]  # the tool's command; the provider wraps it with the runner
    image: str | None
    env: dict[str, str]  # the runner's environment (CONTROLPLANE_*), plus the tool's own env
    cpu: float
    memory_mb: int
    gpu: int
    scratch_mb: int
    max_runtime_s: int
    resource_class: str
    options: dict[str, Any] = field(default_factory=dict)  # resource class + tool provider_options


@dataclass(frozen=True)
class JobStatus:
    phase: JobPhase
    reason: str | None = None  # provider's words: statusReason, execution reason, ...
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # Set while PENDING when the job waits on something that may never come (no capacity, an
    # image that cannot be pulled). The control plane shows it in get_task_status.
    waiting_reason: str | None = None
    # Set when the provider's policy says to stop waiting: the control plane stops the job and
    # fails the attempt (LAUNCH_FAILED) instead of holding its slot for ever.
    give_up_reason: str | None = None
    raw_status: str | None = None  # the provider's own status word


@dataclass(frozen=True)
class LogLine:
    ts: float
    message: str
    stream: str = "stdout"


@dataclass(frozen=True)
class LogPage:
    lines: list[LogLine]
    next_cursor: str | None
    reason: str | None = None  # e.g. "log stream not created yet"


class ProviderError(Exception):
    pass


class TransientProviderError(ProviderError):
    """Throttling, 5xx, network: retry later, never fail a task for this alone."""


class PermanentProviderError(ProviderError):
    """The request is wrong and will stay wrong (e.g. an unknown job queue)."""


class Provider(ABC):
    name: str = "base"
    poll_batch_size: int = 100
    capabilities: frozenset[Capability] = frozenset()
    # How often the control plane should poll this provider (seconds); cloud APIs have quotas.
    poll_interval_s: float = 5.0

    def supports(self, cap: Capability) -> bool:
        return cap in self.capabilities

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise ValueError if a catalog entry's provider_options cannot work (checked at start)."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> Handle: ...

    def find(self, spec: LaunchSpec) -> Handle | None:
        """The handle of a job already launched for `spec.job_name`, or None."""
        raise NotImplementedError

    @abstractmethod
    def poll(self, handles: list[Handle]) -> list[JobStatus]: ...

    @abstractmethod
    def cancel(self, handle: Handle, reason: str = "cancelled") -> None: ...

    def logs(self, handle: Handle, cursor: str | None, limit: int) -> LogPage:
        raise NotImplementedError

    def log_link(self, handle: Handle) -> str | None:
        return None

    def close(self) -> None:
        pass
