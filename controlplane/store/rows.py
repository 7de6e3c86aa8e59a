"""Typed, frozen rows: what the store hands out instead of dicts.

Each class mirrors the columns a query selects (`from_row` takes the driver's mapping), so a
misspelt field is an AttributeError at once rather than a KeyError somewhere later, and nothing
that reads a row can change it behind the store's back (a write returns a new row).
JSON columns stay text here; the properties decode them for the readers that want them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple, Self, cast

from controlplane import ids
from controlplane.states import JobState, TaskState

# A state's enum member by its text (faster than calling the enum, which the reconciler would do
# 20,000 times a cycle with 10,000 jobs in flight).
_TASK_STATES: dict[str, TaskState] = {s.value: s for s in TaskState}
_JOB_STATES: dict[str, JobState] = {s.value: s for s in JobState}


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def _object(text: str | None) -> dict[str, Any] | None:
    """A JSON object column, decoded (None when empty)."""
    return cast("dict[str, Any] | None", _loads(text))


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    named = getattr(cls, "_fields", None)  # a named tuple's
    return tuple(named) if named is not None else tuple(f.name for f in fields(cls))


class _Row:
    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Self:
        try:  # the usual case: the query selected exactly the row's columns
            return cls(**row)  # (a plain dict: `**` of a SQLAlchemy RowMapping is slow)
        except TypeError:  # more columns than the row has fields (a join): keep the row's own
            return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})  # type: ignore[arg-type]

    @classmethod
    def many(cls, columns: list[str], tuples: Sequence[Sequence[Any]]) -> list[Self]:
        """Rows from the driver's tuples: positionally when the query selects the row's fields in
        their order (log pages, the audit), else by name."""
        if tuple(columns) == _field_names(cls):  # type: ignore[arg-type]  # a class is hashable; mypy reads type[Self] as not
            return [cls(*t) for t in tuples]
        return [cls.from_row(dict(zip(columns, t, strict=True))) for t in tuples]

    def but(self, **changes: Any) -> Self:
        """A copy with `changes` (the row as a write left it)."""
        return replace(self, **changes)  # type: ignore[type-var]


class _TaskJson:
    """The JSON columns of a task row, decoded (a fresh value at each read)."""

    __slots__ = ()
    progress_json: str | None
    error_json: str | None
    result_json: str | None
    tags_json: str

    @property
    def progress(self) -> dict[str, Any] | None:
        return _object(self.progress_json)

    @property
    def error(self) -> dict[str, Any] | None:
        return _object(self.error_json)

    @property
    def result(self) -> Any:
        return _loads(self.result_json)

    @property
    def tags(self) -> list[str]:
        return cast("list[str]", json.loads(self.tags_json or "[]"))


class _JobHandle:
    """A job row's provider handle as stored (decode it with `Provider.handle`)."""

    __slots__ = ()
    handle_json: str | None

    @property
    def handle(self) -> dict[str, Any] | None:
        return _object(self.handle_json)


@dataclass(frozen=True, slots=True)
class TaskRow(_TaskJson, _Row):
    pk: int
    task_id: str
    owner: str
    tool_name: str
    inputs_json: str
    input_size: float | None
    provider: str
    resource_class: str
    store_url: str
    priority: int
    ttl_s: int
    idempotency_key: str | None
    tags_json: str
    resources_json: str
    max_runtime_s: int
    state: TaskState
    attempt: int
    max_attempts: int
    not_before: float
    submitted_at: float
    updated_at: float
    version: int
    scheduled_at: float | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    completed_at: float | None = None
    expires_at: float | None = None
    timeout_at: float | None = None
    job_id: str | None = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    stop_reason: str | None = None
    progress_json: str | None = None
    result_json: str | None = None
    error_json: str | None = None
    metrics_json: str | None = None
    estimate_s: float | None = None
    log_seq: int = 0
    log_first_seq: int = 1
    failures: int = 0  # attempts the tool itself failed, retried (the tool's budget: max_attempts)
    recoveries: int = 0  # attempts lost, preempted or not launched, retried (max_recoveries)
    max_recoveries: int = 0
    team: str | None = None  # the team whose members may read it
    estimate_cost: float | None = None  # what the submit estimated it would cost (None: unpriced)
    sweep_id: str | None = None  # the sweep it is a shard of (None: a task of its own)
    shard: int | None = None  # its 0-based index in the sweep

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _TASK_STATES[self.state])
        object.__setattr__(self, "cancel_requested", bool(self.cancel_requested))

    @property
    def ref(self) -> ids.AttemptRef:
        """The task's current attempt."""
        return ids.AttemptRef(self.task_id, self.attempt)


@dataclass(frozen=True, slots=True)
class TaskSummary(_TaskJson, _Row):
    """A task as a page of list_tasks shows it (not its inputs or result)."""

    pk: int
    task_id: str
    tool_name: str
    state: TaskState
    priority: int
    resource_class: str
    attempt: int
    submitted_at: float
    updated_at: float
    tags_json: str
    started_at: float | None = None
    completed_at: float | None = None
    progress_json: str | None = None
    sweep_id: str | None = None  # the sweep it is a shard of

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _TASK_STATES[self.state])


@dataclass(frozen=True, slots=True)
class JobRow(_JobHandle, _Row):
    job_id: str
    task_id: str
    attempt: int
    provider: str
    resource_class: str
    job_name: str
    state: JobState
    created_at: float
    handle_json: str | None = None
    launched_at: float | None = None
    seen_at: float | None = None
    finished_at: float | None = None
    stop_requested_at: float | None = None
    stop_sent_at: float | None = None
    event_seq: int = 0
    provider_status: str | None = None
    provider_reason: str | None = None
    secret_claim: str | None = None
    abandoned_at: float | None = None
    extra_claims: int = 0  # claims refused to extra executions of the attempt
    extra_checked: int = 0  # ... that the reconciler has looked into
    extra_stopped: int = 0  # extra executions it stopped
    placement: int = 0  # which of its tool's placements it runs on (`provider` is that placement's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _JOB_STATES[self.state])

    @property
    def ref(self) -> ids.AttemptRef:
        """The job's attempt."""
        return ids.AttemptRef(self.task_id, self.attempt)


class WatchedJob(NamedTuple):
    """A job the reconciler watches, with what it needs of its task.

    The task's fields are as `JobStore.watched_pages` knows them: read for a task that needs more
    than a poll (not yet running, being cancelled, past its timeout); for any other active job,
    its task is running the job's attempt within its timeout (`timeout_at` None: not past it);
    for a draining job, the task is not read (None).

    A named tuple rather than a frozen dataclass like the other rows (immutable all the same):
    the reconciler builds one per watched job every cycle, 100,000 a cycle with 100,000 tasks in
    flight, and a frozen dataclass's `__init__` (one `object.__setattr__` per field) cost about
    four times as much (`bench/inflight.py`)."""

    job_id: str
    task_id: str
    attempt: int
    provider: str
    event_seq: int
    handle_json: str | None
    seen_at: float | None
    stop_requested_at: float | None
    stop_sent_at: float | None
    provider_status: str | None
    provider_reason: str | None
    created_at: float  # the job's (with job_id, the cursor of the reconciler's paged walk)
    extra_claims: int  # claims refused to extra executions of the attempt
    extra_checked: int  # ... that the reconciler has looked into
    placement: int  # which of its tool's placements it runs on
    launched_at: float | None
    job_state: JobState
    task_attempt: int | None  # the task's, from here on
    timeout_at: float | None
    stop_reason: str | None
    state: TaskState | None

    @classmethod
    def of_jobs(cls, jobs: list[tuple[Any, ...]], tasks: Mapping[str, tuple[Any, ...]]) -> list[WatchedJob]:
        """Rows from the driver's tuples of `job_queries.WATCHED_PAGE` (the job's fields up to its
        state) and the (attempt, timeout_at, stop_reason, state) of the tasks read for them."""
        new, job_states, active, running = tuple.__new__, _JOB_STATES, JobState.ACTIVE, TaskState.RUNNING
        out = []
        for t in jobs:
            job_state = job_states[t[-1]]
            task = tasks.get(t[1])
            if task is None:
                task = (t[2], None, None, running) if job_state is active else (None, None, None, None)
            out.append(new(cls, t[:-1] + (job_state, *task)))
        return out

    @property
    def handle(self) -> dict[str, Any] | None:
        """The provider handle as stored (decode it with `Provider.handle`)."""
        return _object(self.handle_json)

    @property
    def ref(self) -> ids.AttemptRef:
        """The job's attempt."""
        return ids.AttemptRef(self.task_id, self.attempt)

    @property
    def job_name(self) -> str:
        return self.ref.job_name

    @property
    def draining(self) -> bool:
        """The task has moved on (finished, or a later attempt) but this job may still run."""
        return self.job_state in (JobState.DRAINING, JobState.ABANDONED) or self.attempt != self.task_attempt

    def with_provider_status(self, status: str, reason: str | None) -> WatchedJob:
        """The same job with what its provider (or a move) says of it now."""
        return self._replace(provider_status=status, provider_reason=reason)


@dataclass(frozen=True, slots=True)
class LogLine(_Row):
    seq: int
    ts: float
    stream: str
    level: str
    message: str
    attempt: int


@dataclass(frozen=True, slots=True)
class EventRow(_Row):
    """One line of a task's audit: a transition, a retry, a launch, ..."""

    pk: int
    task_id: str
    ts: float
    kind: str
    attempt: int
    from_state: str | None = None
    to_state: str | None = None
    detail_json: str | None = None

    @property
    def detail(self) -> dict[str, Any] | None:
        return _object(self.detail_json)


@dataclass(frozen=True, slots=True)
class ArtifactRow(_Row):
    artifact_id: str
    task_id: str
    attempt: int
    name: str
    kind: str
    size_bytes: int
    sha256: str
    content_type: str
    store_url: str
    storage_key: str
    created_at: float


@dataclass(frozen=True, slots=True)
class CallerLimitsRow(_Row):
    """An operator's limits for one caller: None keeps the default, -1 is no limit."""

    owner: str
    submits_per_minute: int | None
    submits_per_day: int | None
    tasks_in_flight: int | None
    streams: int | None
    updated_at: float


@dataclass(frozen=True, slots=True)
class BudgetRow(_Row):
    """An operator's budget: at most `amount` per calendar `period` for one caller or tag."""

    scope: str  # "owner" | "tag"
    subject: str
    period: str  # "day" | "week" | "month" (UTC)
    amount: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class UploadRow(_Row):
    """A file a caller brings: pending until verified, complete after."""

    upload_id: str
    owner: str
    team: str | None
    name: str
    size_bytes: int
    sha256: str
    content_type: str
    store_url: str
    storage_key: str
    session: str | None
    state: str  # "pending" | "complete"
    created_at: float
    expires_at: float
    completed_at: float | None


@dataclass(frozen=True, slots=True)
class SweepRow(_Row):
    """A sweep: one submit of `shards` tasks of one tool (`store.sweeps`)."""

    pk: int
    sweep_id: str
    owner: str
    tool_name: str
    resource_class: str
    base_inputs_json: str
    vary_json: str
    shards: int
    priority: int
    tags_json: str
    created_at: float
    team: str | None = None
    max_parallel: int | None = None
    fail_fast: int | None = None
    idempotency_key: str | None = None
    estimate_s: float | None = None
    estimate_cost: float | None = None
    stopped_at: float | None = None
    stop_reason: str | None = None
    stop_done_at: float | None = None

    @property
    def tags(self) -> list[str]:
        return cast("list[str]", json.loads(self.tags_json or "[]"))
