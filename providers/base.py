"""The provider interface: how the control plane launches, watches, stops and reads one job.

A provider turns a `LaunchSpec` into a job on some runner (local processes, AWS Batch, Cloud Run
Jobs, Azure Container Apps Jobs) and answers questions about it later. Providers are plug-ins:
`providers/registry.py` finds them by name (entry-point group `controlplane.providers`), and the
core never names one. Each provider class brings

* `Settings`: its own pydantic-settings model, read from `CONTROLPLANE_<NAME>_*` variables (the
  core's settings hold no field of any runner);
* `Options`: the typed model that a catalog entry's `provider_options` (resource class merged
  with tool) is validated against when the catalog loads; the `LaunchSpec` carries the result;
* `handle_type`: its own frozen `Handle` dataclass (`handles.py`). The control plane stores
  `handle.encode()` and gives every later call `provider.handle(stored)`, so a provider reads
  typed fields and keeps no state in memory that it cannot rebuild from handles;
* `__init__(settings, context)`: what the core lends it (`ProviderContext`).

Each method of `Provider` says what it promises (idempotency, blocking, what it raises). Every
method may block on the network: the control plane calls providers from worker threads, never
on its event loop. API errors are classified by what the control plane does next
(`errors.py`): `TransientProviderError` (retried with backoff, never fails a task),
`CapacityProviderError` (no room now: a quota or a full region), `PermanentProviderError` (the
request is wrong); anything else is treated as transient. Optional capabilities are declared in
`capabilities`, never guessed by trying. Cloud SDKs are imported only inside their provider
module, never by the core.

The value types live beside this module (`jobs.py`, `options.py`, `handles.py`, `errors.py`) and
are importable from here too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from controlplane_providers.errors import (
    CapacityProviderError,
    MalformedHandle,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from controlplane_providers.handles import Handle, omitted_if_none
from controlplane_providers.jobs import JobPhase, JobStatus, LaunchSpec, LogLine, LogPage, Shape
from controlplane_providers.options import ProviderOptions, ProviderSettings, WaitPolicy, waiting_verdict

__all__ = [
    "CapacityProviderError", "Capability", "Handle", "JobPhase", "JobStatus", "LaunchSpec", "LogLine", "LogPage",
    "MalformedHandle", "PermanentProviderError", "Provider", "ProviderContext", "ProviderError", "ProviderOptions",
    "ProviderSettings", "Shape", "TransientProviderError", "WaitPolicy", "omitted_if_none", "waiting_verdict",
]


class Capability(StrEnum):
    LOGS = "logs"  # logs(handle, cursor, limit) reads the native log
    LOG_LINK = "log_link"  # log_link(handle) returns a console URL
    SCRATCH = "scratch"  # scratch_limit_mb(shape) can guarantee scratch disk for some shapes


@dataclass(frozen=True)
class ProviderContext:
    """What the core lends a provider: where it may keep files, and the core's own knobs."""

    home: Path  # the control plane's home directory (a provider keeps its files in a subdirectory)
    kill_grace_s: float  # SIGTERM -> SIGKILL grace the runner uses
    endpoint_file: Path  # where the running server writes its callback URL (for runners on this host)


H = TypeVar("H", bound=Handle)


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
    # The object stores (URL schemes, "s3://") its jobs reach by their own identity; None: any the
    # control plane can open (its jobs run beside it).
    own_stores: ClassVar[tuple[str, ...] | None] = None
    # True: a job it reports stuck waiting (past its `stuck_after_s`) was refused for room, and
    # moves to the tool's next placement when there is one.
    stuck_is_no_room: ClassVar[bool] = False

    @classmethod
    def configured(cls, home: Path | str, *, kill_grace_s: float = 5.0, **settings: Any) -> Provider[Any]:
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
        """Handles with one key are polled together, in calls of at most `poll_batch_size`: a
        cloud without a batch get (one list call per job) declares the job as its key."""
        return None

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> H:
        """Start the job `spec` describes, named `spec.job_name` (or tagged with it) so that
        `find` can look it up.

        NOT idempotent: the control plane records its intent first and calls `find` before any
        launch that may already have happened. A launch that makes sure of what the task asked
        (its scratch disk, a shape the runner allows) refuses when it cannot.

        Returns: the new job's handle (its provider's `handle_type`).
        Raises: TransientProviderError (it may or may not have started: `find` decides),
            CapacityProviderError (refused for room or quota, nothing started),
            PermanentProviderError (the request is wrong: LAUNCH_FAILED)."""

    @abstractmethod
    def find(self, spec: LaunchSpec) -> H | None:
        """The handle of a job already launched for `spec.job_name`, or None: nothing was
        launched, so launching now starts it once. Called before any launch that may already
        have happened (a restart, a launch that failed in an unknown way); required (the
        registry refuses a provider without it).

        Raises: TransientProviderError when the runner cannot tell yet (a listing that may lag
            behind a launch that failed ambiguously): look again later, do not launch."""

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
    def poll(self, handles: list[H]) -> list[JobStatus]:
        """The status of each job, in the order of `handles` (one group of one `poll_key`, at
        most `poll_batch_size` of them). A job the runner no longer knows is `JobPhase.GONE`,
        never an exception. What a job used is read from an ended job's `started_at` and
        `finished_at`: the runner's own record of the run where it keeps one.

        Raises: TransientProviderError when the runner cannot answer now."""

    @abstractmethod
    def cancel(self, handle: H, reason: str = "cancelled") -> None:
        """Ask the job to stop; `reason` goes to the runner where it keeps one. Idempotent,
        callable in any state (a job already ended or gone is fine) and safe to repeat: the
        control plane repeats it until `poll` reports the job stopped.

        Raises: TransientProviderError when the runner cannot be asked now."""

    def logs(self, handle: H, cursor: str | None, limit: int) -> LogPage:
        """At most `limit` lines of the runner's native log after `cursor` (None: from the start),
        with the cursor to pass next. A log that does not exist (yet), or a read over the
        service's quota, is an empty page with a reason and the cursor unchanged. Only for a
        provider that declares `Capability.LOGS`.

        Raises: TransientProviderError when the log service cannot be read now (not for a read
        over its quota), PermanentProviderError when the read itself is wrong."""
        raise NotImplementedError

    def log_link(self, handle: H) -> str | None:
        """A console URL where a human reads the job's log (`Capability.LOG_LINK`), or None."""
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
        """Release the provider's clients; the instance is not used again."""
