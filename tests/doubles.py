"""`MemoryProvider`: an in-memory job runner for core tests, which keeps every job in memory and
starts no process, and answers the provider contract (`tests/test_doubles.py` runs the suite of
`tests/provider_contract.py` against it).

A job runs until the test says otherwise (`end`, `set_status`, `lose`) or the control plane
cancels it, except a job of `python -c SCRIPT` (the contract's jobs): its script is played at
launch, here, with `time.sleep` adding to the job's run instead of waiting and `print` writing
its log; the job then runs that long on the wall clock and ends with the script's exit code.

What a test can tell it, all deterministic but `fault_rate` (seeded):

* `fail_next_launch(error, started=...)`: the next launch raises `error` (TransientProviderError,
  CapacityProviderError, PermanentProviderError), before anything started or, with `started`,
  after the job started (an answer lost on the way back);
* `start_jobs = False`: new jobs wait PENDING (no capacity) until it is True again;
* `ignore_cancel = True`: a cancel is answered and recorded, and the job runs on;
* `lose(handle)`: the runner forgets the job (`poll` answers GONE);
* `list_lag_s`: `find` and `find_all` see a job only this long after its launch;
* `fail_looks`: the next n `find`/`find_all` calls raise TransientProviderError;
* `fault_rate`: that share of every call raises TransientProviderError (a launch before or after
  its job started);
* `settings.log_reads_per_min`: its log reads' quota, kept as the clouds' log tails keep theirs
  (`providers/logtail.py`): a read over it is an empty page that says when to try again.

What it records: `calls` (by method; `log_reads`: the log reads within the quota), `polls` (the
handles of each poll call), `cancels` ((execution, reason)), `looks` (the job names `find_all` was
asked for).
"""

from __future__ import annotations

import builtins
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pydantic_settings import SettingsConfigDict

from controlplane_providers import logtail
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
    ProviderError,
    ProviderSettings,
    TransientProviderError,
    omitted_if_none,
)
from controlplane_providers.ratelimit import SlidingWindowLimiter


@dataclass(frozen=True)
class MemoryHandle(Handle):
    job: str  # the attempt's job name
    execution: str  # the first job launched under that name: the name; the n-th: "<name>-<n>"
    group: str = ""  # its poll key
    seen_at: float | None = omitted_if_none()  # when a launch returned it (not part of its identity)


class MemorySettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_MEMORY_")

    log_reads_per_min: int = 600


@dataclass
class _Job:
    handle: MemoryHandle
    created: float
    run_s: float | None = None  # how long it runs once started; None: until told
    exit_code: int = 0
    output: list[tuple[float, str]] = field(default_factory=list)  # (seconds into the run, line)
    started_at: float | None = None
    status: JobStatus | None = None  # set by the test or an end: answered as is


class MemoryProvider(Provider[MemoryHandle]):
    """See the module docstring. Safe to call from several threads."""

    handle_type = MemoryHandle
    capabilities = frozenset({Capability.LOGS})

    def __init__(self, name: str = "local", *, poll_batch_size: int = 100, poll_interval_s: float = 0.0,
                 seed: int = 1):
        self.name = name
        self.settings = MemorySettings()
        self.poll_batch_size = poll_batch_size
        self.poll_interval_s = poll_interval_s
        self.start_jobs = True
        self.ignore_cancel = False
        self.list_lag_s = 0.0
        self.fail_looks = 0
        self.fault_rate = 0.0
        self.calls: Counter[str] = Counter()
        self.polls: list[list[MemoryHandle]] = []
        self.cancels: list[tuple[str, str]] = []
        self.looks: list[str] = []
        self.on_next_poll: Callable[[], None] | None = None  # called once, inside the next poll
        self._launch_failures: list[tuple[ProviderError, bool]] = []
        self._jobs: dict[str, _Job] = {}  # execution -> job
        self._names: dict[str, list[str]] = {}  # job name -> executions, oldest first
        self._rng = random.Random(seed)
        self._log_limiter: SlidingWindowLimiter | None = None
        self._lock = threading.RLock()

    # ---- what a test tells it -------------------------------------------------------------------
    def start(self, job_name: str, *, group: str = "", play: tuple[float, int, list[tuple[float, str]]] | None = None,
              started: bool = True) -> MemoryHandle:
        """A job of `job_name` that the runner runs from now (as if launched): its handle."""
        with self._lock:
            executions = self._names.setdefault(job_name, [])
            now = time.time()
            n = len(executions) + 1
            handle = MemoryHandle(job_name, job_name if n == 1 else f"{job_name}-{n}", group, seen_at=now)
            job = _Job(handle, created=now)
            if play is not None:
                job.run_s, job.exit_code, job.output = play
            if started and self.start_jobs:
                job.started_at = now
            executions.append(handle.execution)
            self._jobs[handle.execution] = job
            return handle

    def fail_next_launch(self, error: ProviderError, *, started: bool = False, times: int = 1) -> None:
        """The next `times` launches raise `error`; with `started`, after their job started."""
        with self._lock:
            self._launch_failures += [(error, started)] * times

    def end(self, handle: MemoryHandle | str, exit_code: int = 0) -> None:
        """The job ends now with `exit_code` (SUCCEEDED for 0, else FAILED)."""
        with self._lock:
            job = self._jobs[self._execution(handle)]
            now = time.time()
            job.status = _ended(exit_code, job.started_at if job.started_at is not None else now, now)

    def set_status(self, handle: MemoryHandle | str, status: JobStatus) -> None:
        """`poll` answers `status` for the job from now on."""
        with self._lock:
            self._jobs[self._execution(handle)].status = status

    def lose(self, handle: MemoryHandle | str) -> None:
        """The runner no longer knows the job."""
        with self._lock:
            execution = self._execution(handle)
            job = self._jobs.pop(execution, None)
            if job is not None:
                self._names[job.handle.job].remove(execution)

    def count(self, job_name: str) -> int:
        """How many jobs the runner keeps for `job_name`."""
        with self._lock:
            return len(self._names.get(job_name, []))

    def polled(self) -> Counter[str]:
        """How many times each job name was polled."""
        with self._lock:
            return Counter(h.job for call in self.polls for h in call)

    # ---- the provider ---------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> MemoryHandle:
        self._call("launch", faults_after_start=True, spec=spec)
        if spec.scratch_mb:
            raise PermanentProviderError(f"{self.scratch_note(spec.shape)}: the task asks for "
                                         f"scratch_mb={spec.scratch_mb}")
        with self._lock:
            failure = self._launch_failures.pop(0) if self._launch_failures else None
            if failure is not None and not failure[1]:
                raise failure[0]
            handle = self.start(spec.job_name, group=_group(spec), play=_played(spec.command))
        if failure is not None:
            raise failure[0]
        return handle

    def find(self, spec: LaunchSpec) -> MemoryHandle | None:
        found = self.find_all(spec)
        return found[0] if found else None

    def find_all(self, spec: LaunchSpec) -> list[MemoryHandle]:
        self._call("find_all")
        with self._lock:
            self.looks.append(spec.job_name)
            if self.fail_looks:
                self.fail_looks -= 1
                raise TransientProviderError("the runner's listing failed (throttled)")
            listed_before = time.time() - self.list_lag_s
            jobs = [self._jobs[e] for e in reversed(self._names.get(spec.job_name, []))]
            return [MemoryHandle(j.handle.job, j.handle.execution, j.handle.group) for j in jobs
                    if j.created <= listed_before]

    def same_job(self, a: MemoryHandle, b: MemoryHandle) -> bool:
        return a.execution == b.execution

    def poll_key(self, handle: MemoryHandle) -> str:
        return handle.group

    def poll(self, handles: list[MemoryHandle]) -> list[JobStatus]:
        self._call("poll")
        with self._lock:
            self.polls.append(list(handles))
            hook, self.on_next_poll = self.on_next_poll, None
        if hook is not None:
            hook()
        with self._lock:
            return [self._status(h.execution) for h in handles]

    def cancel(self, handle: MemoryHandle, reason: str = "cancelled") -> None:
        self._call("cancel")
        with self._lock:
            self.cancels.append((handle.execution, reason))
            job = self._jobs.get(handle.execution)
            if job is not None and not self.ignore_cancel and self._status(handle.execution).phase not in ENDED:
                now = time.time()
                job.status = JobStatus(JobPhase.FAILED, reason=f"cancelled: {reason}",
                                       started_at=job.started_at, finished_at=now, raw_status="cancelled")

    def logs(self, handle: MemoryHandle, cursor: str | None, limit: int) -> LogPage:
        self._call("logs")
        rate = self.settings.log_reads_per_min
        with self._lock:
            if self._log_limiter is None or self._log_limiter.rate != rate:  # a new quota starts afresh
                self._log_limiter = SlidingWindowLimiter(rate, window_s=60.0)
            limiter = self._log_limiter
        quota = f"the memory provider allows {rate} log reads a minute"
        return logtail.within_quota(limiter, cursor, quota, lambda: self._read_logs(handle, cursor, limit))

    def _read_logs(self, handle: MemoryHandle, cursor: str | None, limit: int) -> LogPage:
        with self._lock:
            self.calls["log_reads"] += 1
            job = self._jobs.get(handle.execution)
            if job is None or job.started_at is None:
                return LogPage([], cursor, reason="the job has not started")
            status = self._status(handle.execution)
            until = (status.finished_at or time.time()) - job.started_at
            written = [(at, line) for at, line in job.output if at <= until]
        start = int(cursor) if (cursor or "").isdigit() else 0
        lines = [LogLine(ts=job.started_at + at, message=line) for at, line in written[start:start + limit]]
        return LogPage(lines, str(start + len(lines)))

    def release(self, handle: MemoryHandle) -> bool:
        self._call("release")
        with self._lock:
            return handle.execution not in self._jobs or self._status(handle.execution).phase in ENDED

    # ---- inside -----------------------------------------------------------------------------------
    def _call(self, method: str, *, faults_after_start: bool = False, spec: LaunchSpec | None = None) -> None:
        with self._lock:
            self.calls[method] += 1
            if not (self.fault_rate and self._rng.random() < self.fault_rate):
                return
            if faults_after_start and spec is not None and self._rng.random() < 0.5:
                self.start(spec.job_name, group=_group(spec), play=_played(spec.command))  # then the answer is lost
        raise TransientProviderError(f"503: {method} failed (injected fault)")

    def _execution(self, handle: MemoryHandle | str) -> str:
        return handle if isinstance(handle, str) else handle.execution

    def _status(self, execution: str) -> JobStatus:
        """Under the lock: the job's status now (GONE for a job the runner does not know)."""
        job = self._jobs.get(execution)
        if job is None:
            return JobStatus(JobPhase.GONE, reason="the runner does not know this job", raw_status="gone")
        if job.status is not None:
            return job.status
        now = time.time()
        if job.started_at is None:
            if not self.start_jobs:
                return JobStatus(JobPhase.PENDING, waiting_reason="no capacity", raw_status="pending")
            job.started_at = now
        if job.run_s is not None and now >= job.started_at + job.run_s:
            job.status = _ended(job.exit_code, job.started_at, job.started_at + job.run_s)
            return job.status
        return JobStatus(JobPhase.RUNNING, started_at=job.started_at, raw_status="running")


ENDED = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.GONE}


def _ended(exit_code: int, started_at: float, finished_at: float) -> JobStatus:
    phase = JobPhase.SUCCEEDED if exit_code == 0 else JobPhase.FAILED
    return JobStatus(phase, reason=None if exit_code == 0 else f"exit {exit_code}", exit_code=exit_code,
                     started_at=started_at, finished_at=finished_at, raw_status=phase.value)


def _group(spec: LaunchSpec) -> str:
    return str(getattr(spec.options, "group", "") or "")


def _played(command: tuple[str, ...]) -> tuple[float, int, list[tuple[float, str]]] | None:
    """(how long it runs, its exit code, its output lines with when they were written) of a
    `python -c SCRIPT` command, the script run here with a clock that only `time.sleep` moves; None
    for any other command. Hand-written because no library plays a script on a virtual clock."""
    if len(command) != 3 or command[1] != "-c":
        return None
    clock = [0.0]
    output: list[tuple[float, str]] = []

    def sleep(s: float) -> None:
        clock[0] += max(0.0, float(s))

    def write(*args: Any, sep: str = " ", end: str = "\n", **_: Any) -> None:
        output.append((clock[0], sep.join(map(str, args))))

    fake_time = SimpleNamespace(sleep=sleep, time=lambda: time.time() + clock[0], monotonic=lambda: clock[0])

    def imports(name: str, *args: Any, **kw: Any) -> Any:
        return fake_time if name == "time" else builtins.__import__(name, *args, **kw)

    scope = {"__builtins__": {**vars(builtins), "print": write, "__import__": imports}, "__name__": "__main__"}
    try:
        exec(command[2], scope)  # noqa: S102 - a test's own script, in a test double
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # noqa: BLE001 - the job fails as python would, with its error in the log
        output.append((clock[0], f"{type(e).__name__}: {e}"))
        code = 1
    return clock[0], code, output
