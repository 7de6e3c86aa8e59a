"""The provider interface: how the control plane launches, watches, stops and reads one job.

A provider turns a `LaunchSpec` into a job on some runner (local processes, AWS Batch, Cloud Run
Jobs, Azure Container Apps Jobs) and answers questions about it later. Providers are plug-ins:
`providers/registry.py` finds them by name (entry-point group `controlplane.providers`), and the
core never names one. Each provider class brings

* `Settings`: its own pydantic-settings model, read from `CONTROLPLANE_<NAME>_*` variables (the
  core's settings hold no field of any runner);
* `Options`: the typed model that a catalog entry's `provider_options` (resource class merged
  with tool) is validated against when the catalog loads; the `LaunchSpec` carries the result;
* `__init__(settings, context)`: what the core lends it (`ProviderContext`).

The contract:

* `launch(spec) -> handle`. The handle is a small JSON-serialisable dict that the control plane
  stores in its database; every later call receives it back. A provider keeps no state in
  memory that it cannot rebuild from handles: the control plane restarts, handles survive.
* Launching is assumed NOT idempotent (Batch SubmitJob, Cloud Run RunJob are not). The control
  plane records its intent before calling `launch`, and after a crash it calls
  `find(spec)` to look the job up by `spec.job_name` (deterministic per task and attempt)
  before it launches again, every time. A provider must name or tag its jobs so that `find`
  works; `find` is required (the registry refuses a provider without it).
* `poll(handles) -> statuses`, answered in the same order. The control plane groups the watched
  handles by `poll_key(handle)` and hands each group over in calls of at most `poll_batch_size`
  handles, so a cloud without a batch get (Cloud Run, Azure: one list call per job) declares the
  job as its key and answers a whole group with one paged list. A job the runner no longer
  knows is `JobPhase.GONE`, never an exception.
* `cancel(handle)` asks the job to stop: idempotent, callable in any state, and safe to repeat;
  the control plane repeats it until `poll` reports the job stopped.
* `logs(handle, cursor, limit)` reads the runner's native log (CloudWatch, Cloud Logging, a
  local file) page by page; a log that does not exist (yet) is an empty page with a reason.
  `log_link(handle)` is a console URL for humans.
* Optional capabilities are declared in `capabilities`, never guessed by trying.
* `python`: what `{python}` in a tool's command stands for inside this runner's jobs (the local
  interpreter locally, `python` in a container image).
* Provider API errors: raise `TransientProviderError` for throttling/5xx/network trouble (the
  control plane retries with backoff and never fails a task for it) and
  `PermanentProviderError` when the request itself is wrong (bad job definition, quota
  refused); anything else is treated as transient.

Cloud SDKs are imported only inside their provider module, never by the core.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Handle = dict[str, Any]


class Capability(StrEnum):
    LOGS = "logs"  # logs(handle, cursor, limit) reads the native log
    LOG_LINK = "log_link"  # log_link(handle) returns a console URL


class ProviderSettings(BaseSettings):
    """A provider's own settings. Subclasses set `model_config = SettingsConfigDict(
    env_prefix="CONTROLPLANE_<NAME>_")`, so every field is an environment variable."""

    model_config = SettingsConfigDict(extra="ignore")


class ProviderOptions(BaseModel):
    """A catalog entry's `provider_options`, validated at catalog load. Unknown keys are errors.
    Validators may read the entry's resources from `info.context` (`cpu`, `memory_mb`, `gpu`,
    `scratch_mb`), e.g. to refuse a shape the runner cannot give."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class WaitPolicy(ProviderOptions):
    """Options of a runner whose jobs may wait for capacity, perhaps for ever: past
    `stuck_after_s` (default: the provider's setting) a waiting job is reported with its reason,
    and with `on_stuck = "fail"` given up on (stopped, the attempt LAUNCH_FAILED)."""

    stuck_after_s: float | None = Field(default=None, gt=0)
    on_stuck: Literal["wait", "fail"] = "wait"


def waiting_verdict(status: str, waited_s: float, why: str, *, stuck_after_s: float, on_stuck: str,
                    noun: str = "job") -> tuple[str | None, str | None]:
    """(waiting_reason, give_up_reason) of a job that has been waiting `waited_s` in `status`."""
    if waited_s <= stuck_after_s:
        return None, None
    waiting = f"{status} for {waited_s / 60:.0f} min: {why}"
    return waiting, (f"the {noun} did not start: {waiting}" if on_stuck == "fail" else None)


@dataclass(frozen=True)
class ProviderContext:
    """What the core lends a provider: where it may keep files, and the core's own knobs."""

    home: Path  # the control plane's home directory (a provider keeps its files in a subdirectory)
    kill_grace_s: float  # SIGTERM -> SIGKILL grace the runner uses
    endpoint_file: Path  # where the running server writes its callback URL (for runners on this host)


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
    # The provider's `Options`: resource class + tool provider_options, validated at catalog load.
    options: Any = field(default_factory=ProviderOptions)


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
    name: ClassVar[str] = "base"
    Settings: ClassVar[type[ProviderSettings]] = ProviderSettings
    Options: ClassVar[type[ProviderOptions]] = ProviderOptions
    poll_batch_size: int = 100
    capabilities: frozenset[Capability] = frozenset()
    # How often the control plane should poll this provider (seconds); cloud APIs have quotas.
    poll_interval_s: float = 5.0
    # What "{python}" in a tool command becomes in this runner's jobs.
    python: str = "python"

    @classmethod
    def configured(cls, home: Path | str, *, kill_grace_s: float = 5.0, **settings: Any) -> Provider:
        """An instance outside a control plane (tests, benchmarks, scripts): its settings from the
        environment, overridden by `settings`, and a context for a control plane at `home`."""
        home = Path(home)
        context = ProviderContext(home=home, kill_grace_s=kill_grace_s, endpoint_file=home / "endpoint.json")
        return cls(cls.Settings(**settings), context)  # type: ignore[call-arg]

    def supports(self, cap: Capability) -> bool:
        return cap in self.capabilities

    def poll_key(self, handle: Handle) -> Hashable:
        """Handles with one key are polled together (one call per `poll_batch_size` of them)."""
        return None

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> Handle: ...

    @abstractmethod
    def find(self, spec: LaunchSpec) -> Handle | None:
        """The handle of a job already launched for `spec.job_name`, or None. Called before any
        launch that may already have happened (a restart, a launch that failed in an unknown way)."""

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
