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

* `launch(spec) -> handle`. The handle is the provider's own frozen dataclass (`handle_type`, a
  `Handle` subclass: `LocalHandle`, `BatchHandle`, ...). The control plane stores
  `handle.encode()` (a JSON-ready dict) in its database (`jobs.handle_json`) and gives every
  later call `provider.handle(stored)`, the same handle decoded again, so a provider reads typed
  fields, never dict keys. The encoded form is the stored format: a field is never renamed, and
  a new one has a default, so that rows written by an earlier version still decode. A provider
  keeps no state in memory that it cannot rebuild from handles: the control plane restarts,
  handles survive.
* Launching is assumed NOT idempotent (Batch SubmitJob, Cloud Run RunJob are not). The control
  plane records its intent before calling `launch`, and after a crash it calls
  `find(spec)` to look the job up by `spec.job_name` (deterministic per task and attempt)
  before it launches again, every time. A provider must name or tag its jobs so that `find`
  works; `find` is required (the registry refuses a provider without it). `find_all(spec)`
  answers every job of that name (a second execution of one attempt is stopped by the
  reconciler, which tells the attempt's own by `same_job`); its default is `find`'s one job.
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
* `release(handle) -> bool` gives back what a job left on the runner once its task has expired
  (the local provider's job directory). Optional (the default has nothing to release),
  idempotent, and it never stops a job: a job still running keeps what it has and the answer is
  False (ask again later); True means nothing is left to release.
* `scratch_limit_mb(shape)`: the scratch disk (MiB) the runner guarantees a job of that shape,
  or None when it cannot reserve any; `scratch_note(shape)` says why, in one sentence. A task
  that asks for `resources.scratch_mb` is refused at submit unless the guarantee covers it, and
  `launch` makes sure the job really gets it (a bigger shape, the job definition that has it) or
  refuses (PermanentProviderError). A provider that can guarantee scratch for some shapes
  declares `Capability.SCRATCH`.
* `price_region(options)`: the region a catalog entry's jobs run in, for the price table (None:
  the provider's default prices). What a job used is read from `poll`'s `started_at` and
  `finished_at` of a job that ended: the provider's own record of the run where it keeps one.
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

import functools
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json
from pydantic_settings import BaseSettings, SettingsConfigDict


class Capability(StrEnum):
    LOGS = "logs"  # logs(handle, cursor, limit) reads the native log
    LOG_LINK = "log_link"  # log_link(handle) returns a console URL
    SCRATCH = "scratch"  # scratch_limit_mb(shape) can guarantee scratch disk for some shapes


# ---- handles ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Handle:
    """A launched job, as its provider finds it again: a frozen dataclass of JSON values.

    `encode()` is what the control plane stores; `decode(stored)` rebuilds the handle, checking
    every field's type (pydantic), ignoring keys it does not know and giving absent fields their
    defaults, so rows written by earlier versions still decode. A field declared with
    `omitted_if_none()` is left out of the encoding while it is None (the stored form of earlier
    versions did not have the key)."""

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omitted_if_none"):
                continue
            out[f.name] = value
        return out

    @classmethod
    def decode(cls, data: dict[str, Any] | str) -> Self:
        """`data` is the stored form: the JSON text (parsed and checked in one pass, which is what
        the reconciler does for every watched job each cycle) or its parsed dict."""
        try:
            if isinstance(data, str):
                return _adapter(cls).validate_json(data)  # type: ignore[no-any-return]
            if not isinstance(data, dict):
                raise MalformedHandle(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
            return _adapter(cls).validate_python(data)  # type: ignore[no-any-return]
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(handle)'}: {err['msg']}"
                                 for err in e.errors())
            raise MalformedHandle(f"malformed {cls.__name__} {_clip(data)}: {problems}") from None

    @classmethod
    def decode_many(cls, texts: Sequence[str]) -> list[Self]:
        """Stored handles (JSON text) decoded together, in order: what the reconciler does for a
        page of watched jobs each cycle. Each text is parsed on its own and all are checked in one
        pydantic pass (one `decode` call each costs about three times as much). MalformedHandle
        if any text is not one handle (`decode` each of them to tell which)."""
        try:
            parsed = [from_json(t) for t in texts]
            if set(map(type, parsed)) <= {dict}:
                return _list_adapter(cls).validate_python(parsed)  # type: ignore[no-any-return]
        except (ValueError, ValidationError):
            pass
        raise MalformedHandle(f"not every one of {len(texts)} texts is a {cls.__name__}")


def omitted_if_none(default: Any = None) -> Any:
    """A handle field that stays out of `encode()` while it is None."""
    return field(default=default, metadata={"omitted_if_none": True})


@functools.cache
def _adapter(cls: type[Handle]) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


@functools.cache
def _list_adapter(cls: type[Handle]) -> TypeAdapter[Any]:
    return TypeAdapter(list[cls])  # type: ignore[valid-type]


def _clip(data: Any, n: int = 200) -> str:
    text = repr(data)
    return text if len(text) <= n else text[: n - 3] + "..."


H = TypeVar("H", bound=Handle)


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
class Shape:
    """What a job may be given: cpu, memory, GPUs and the provider's options. For a submit's
    check it is the resource class's (the most a task of the class may have); in `launch` it is
    the task's own (`LaunchSpec.shape`)."""

    resource_class: str
    cpu: float
    memory_mb: int
    gpu: int
    options: Any = field(default_factory=ProviderOptions)


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
    scratch_mb: int  # scratch disk the task asked for (resources.scratch_mb); 0: none asked
    max_runtime_s: int
    resource_class: str
    # The provider's `Options`: resource class + tool provider_options, validated at catalog load.
    options: Any = field(default_factory=ProviderOptions)

    @property
    def shape(self) -> Shape:
        return Shape(self.resource_class, self.cpu, self.memory_mb, self.gpu, self.options)


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
    # An ended job's last console lines, from a provider whose log lives only as long as the job
    # (the local provider's console.log): the control plane copies them into the task's logs and
    # error when the runner reported no outcome. Cloud providers keep their log service instead.
    last_output: tuple[str, ...] = ()


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


class CapacityProviderError(ProviderError):
    """The runner has no room for the job now (a full region or zone, a vCPU, job or concurrency
    quota): the request is sound and may succeed later or on another placement."""


class MalformedHandle(ProviderError, ValueError):
    """A stored handle that is not one of this provider's (a missing or mistyped field)."""


class Provider(ABC, Generic[H]):
    name: ClassVar[str] = "base"
    Settings: ClassVar[type[ProviderSettings]] = ProviderSettings
    Options: ClassVar[type[ProviderOptions]] = ProviderOptions
    # The provider's own Handle subclass: what launch/find return and every other call takes.
    handle_type: ClassVar[type[Handle]] = Handle
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

    def handle(self, data: dict[str, Any] | str) -> H:
        """A stored handle (`handle.encode()`, as JSON text or read back from it) as this provider's handle;
        MalformedHandle, naming the provider and the field, when it is not one."""
        if self.handle_type is Handle:
            raise TypeError(f"{type(self).__name__} declares no handle_type")
        try:
            return self.handle_type.decode(data)  # type: ignore[return-value]
        except MalformedHandle as e:
            raise MalformedHandle(f"provider {self.name}: {e}") from None

    def handles(self, texts: Sequence[str]) -> list[H | MalformedHandle]:
        """Stored handles (JSON text) as this provider's handles, in order, decoded together; a
        text that is not one comes back as the MalformedHandle `handle` raises for it."""
        if self.handle_type is Handle:
            raise TypeError(f"{type(self).__name__} declares no handle_type")
        try:
            return self.handle_type.decode_many(texts)  # type: ignore[return-value]
        except MalformedHandle:
            pass
        out: list[H | MalformedHandle] = []  # find which, and say why
        for t in texts:
            try:
                out.append(self.handle(t))
            except MalformedHandle as e:
                out.append(e)
        return out

    def poll_key(self, handle: H) -> Hashable:
        """Handles with one key are polled together (one call per `poll_batch_size` of them)."""
        return None

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> H: ...

    @abstractmethod
    def find(self, spec: LaunchSpec) -> H | None:
        """The handle of a job already launched for `spec.job_name`, or None. Called before any
        launch that may already have happened (a restart, a launch that failed in an unknown way)."""

    def find_all(self, spec: LaunchSpec) -> list[H]:
        """Every job the runner has for `spec.job_name`, newest first, ended ones included: one
        normally, more when the attempt was launched again (a paused leader waking after its
        successor launched, a retried launch whose first try did start, a cloud's own retry).
        The reconciler stops those that are not the attempt's own. The default is `find`'s one
        job, for a runner that never keeps two jobs of one name."""
        found = self.find(spec)
        return [] if found is None else [found]

    def same_job(self, a: H, b: H) -> bool:
        """Whether two handles name one job: a handle `find_all` rebuilt can differ from the one
        `launch` returned in what is not the job's identity (a creation time, a catalog policy).
        The default compares the encoded handles."""
        return a.encode() == b.encode()

    @abstractmethod
    def poll(self, handles: list[H]) -> list[JobStatus]: ...

    @abstractmethod
    def cancel(self, handle: H, reason: str = "cancelled") -> None: ...

    def logs(self, handle: H, cursor: str | None, limit: int) -> LogPage:
        raise NotImplementedError

    def log_link(self, handle: H) -> str | None:
        return None

    def release(self, handle: H) -> bool:
        """Give back what the job left on the runner, once its task has expired. Idempotent; never
        stops a job. True: nothing is left to release (now or already); False: the job still
        runs and keeps what it has (ask again later). Default: nothing to release."""
        return True

    def price_region(self, options: Any) -> str | None:
        """The region the jobs of a catalog entry with these `options` run in, as the price
        table names regions (`controlplane/prices.py`); None: the provider's default prices."""
        return None

    def scratch_limit_mb(self, shape: Shape) -> int | None:
        """The scratch disk (MiB) a job of `shape` is guaranteed, or None: this runner cannot
        reserve scratch disk for it. May ask the runner's API (cached); may raise
        TransientProviderError."""
        return None

    def scratch_note(self, shape: Shape) -> str:
        """One sentence on the scratch disk the runner gives a job of `shape` (why none, or what
        the limit comes from), for the error a submit gets when it asks for more."""
        return f"the {self.name} provider cannot reserve scratch disk for a job"

    def close(self) -> None:
        pass
