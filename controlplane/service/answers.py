"""The answers of the task operations, as typed models.

Each model's `dump()` is the answer's JSON object exactly as the tools write it: fields in
declaration order; a field with a default is an optional key, written only when the operation
set it (even to None); a field without one is always written, null or not.

The same models describe the answers to clients: each tool publishes its answer's JSON schema as
its `outputSchema` (`controlplane.mcp.tools.output_schema`). Three answers take one of two shapes:
tail_task_logs' (`TailAnswer`), wait_task's (`WaitAnswer`) and a catalog tool's (`CatalogToolAnswer`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from typing_extensions import TypedDict

from controlplane.states import TaskState

# A JSON number written as the operation computed it (an int stays an int, unlike `float`).
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
# A task's error as stored ({code, message, hint?} and whatever the failure added), kept as it is.
TaskError = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "description": "Why the task did not succeed: a code of the documented set, what "
    "happened and, sometimes, a hint.",
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "hint": {"type": "string"}}})]


class Answer(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        """The answer as the tools write it (optional keys only when set)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class Money(Answer):
    amount: Number | None
    currency: str


class CostSoFar(Money):
    """Cost at list price of what a task used so far, and the estimate made at submit."""

    at_submit: Number | None


class UsageFigures(Answer):
    run_seconds: Number
    vcpu_seconds: Number
    memory_gib_seconds: Number
    gpu_seconds: Number


class SubmitAnswer(Answer):
    task_id: str
    state: TaskState
    queue: str
    position: int | None
    submitted_at: str | None
    poll_after_ms: int
    estimated_runtime_seconds: Number | None
    estimated_cost: Money
    deduplicated: bool | None = None  # only when the idempotency key found an earlier task
    message: str | None = None  # only for a catalog tool called by name (`DirectAnswer`)


class DirectAnswer(SubmitAnswer):
    """A catalog tool called by name: submit_task's answer, plus a message saying how to follow
    the task."""

    message: str


class Usage(Answer):
    """What a task used and its cost: part of a status and of a result."""

    usage: UsageFigures
    estimated_cost: CostSoFar


class Move(Answer):
    attempt: int  # the attempt that moved off its placement
    placement: int  # that placement's index in the tool's list
    provider: str
    reason: str  # why it found no room there, in its provider's words where it gave them
    at: str | None  # when


class TaskStatus(Answer):
    task_id: str
    state: TaskState
    tool_name: str
    attempt: int
    max_attempts: int
    priority: int
    queue: str
    position: int | None
    job_id: str | None  # the current attempt's provider job (controlplane jobs lists it)
    worker_id: Annotated[str | None, Field(deprecated="job_id's old name: the same value")]
    submitted_at: str | None
    started_at: str | None
    updated_at: str | None
    heartbeat_at: str | None
    completed_at: str | None
    expires_at: str | None
    timeout_at: str | None
    progress: dict[str, Any] | None
    cancel_requested: bool
    estimated_runtime_seconds: Number | None
    tags: list[str]
    error: TaskError | None
    poll_after_ms: int | None
    usage: UsageFigures
    estimated_cost: CostSoFar
    waiting_reason: str | None = None  # only while scheduled, when the provider said why
    waiting_for: list[str] | None = None  # only while waiting: the parents (`after`) not yet succeeded
    log_link: str | None = None  # only for a provider with a console link
    provider: str | None = None  # once the attempt is placed: the provider its job runs on
    placement: int | None = None  # ... and its placement's index in the tool's list (several placements only)
    moves: list[Move] | None = None  # the attempts that moved off a placement for want of room (several only)


class LogLine(Answer):
    seq: int
    ts: str | None
    stream: str
    level: str
    message: str
    attempt: int


class LogPage(Answer):
    task_id: str
    state: TaskState
    lines: list[LogLine]
    next_cursor: str
    truncated: bool
    has_more: bool


class ProviderLogLine(Answer):
    ts: str | None
    stream: str
    message: str


class ProviderLogPage(Answer):
    task_id: str
    state: TaskState
    source: Literal["provider"]
    attempt: int
    lines: list[ProviderLogLine]
    next_cursor: str
    reason: str | None = None  # only when the page is empty for a reason


# tail_task_logs answers with the control plane's own log, or with the provider's (source="provider").
TailAnswer = LogPage | ProviderLogPage


class ListedTask(TypedDict):
    """One task of a list_tasks page."""

    # A plain dict, not a model: a page holds hundreds, and a model per row cost a third more.

    task_id: str
    state: TaskState
    tool_name: str
    priority: int
    queue: str
    attempt: int
    submitted_at: str | None
    started_at: str | None
    updated_at: str | None
    completed_at: str | None
    tags: list[str]
    percent: Number | None
    owner: NotRequired[str]  # only in a list of everyone's tasks
    sweep: NotRequired[str]  # only on a sweep's shard: its sweep's id
    # Only on a sweep's own row (list_tasks' whole_sweeps): task_id is then the sweep's id too.
    sweep_id: NotRequired[str]
    shards: NotRequired[str]  # "ended/all N run N failed"
    counts: NotRequired[dict[str, int]]  # shards per state
    cost: NotRequired[Number | None]  # estimated so far
    currency: NotRequired[str | None]


class TaskList(Answer):
    tasks: list[ListedTask]
    next_cursor: str | None

    def dump(self) -> dict[str, Any]:
        """The rows as they are (already the dicts the answer holds): the serializer cost a
        page of 200 rows a third more."""
        return {"tasks": self.tasks, "next_cursor": self.next_cursor}


class CancelAnswer(Answer):
    task_id: str
    state: TaskState
    acknowledged: bool
    message: str | None = None  # only when there was nothing to cancel


class Artifact(Answer):
    artifact_id: str
    name: str
    kind: str
    size_bytes: int
    sha256: str
    content_type: str
    download_url: str
    expires_at: str | None
    file_url: str | None = None  # only for a caller on this machine, local store


class TaskResult(Answer):
    task_id: str
    state: TaskState
    result: Any
    artifacts: list[Artifact]
    error: TaskError | None
    completed_at: str | None
    attempt: int
    usage: UsageFigures
    estimated_cost: CostSoFar
    message: str | None = None  # only while the result is not there (not done, or expired)
    poll_after_ms: int | None = None  # likewise (null once expired)




class WaitDone(TaskResult):
    """wait_task's answer once the task ended: get_task_result's answer, with done=true."""

    done: Literal[True]

    @classmethod
    def of(cls, result: TaskResult) -> WaitDone:
        return cls(done=True, **{name: getattr(result, name) for name in result.model_fields_set})

    def dump(self) -> dict[str, Any]:
        return {"done": True, **super().dump()}  # `done` first, as a reader looks for it


class WaitPending(Answer):
    """wait_task's answer when its timeout came first: done=false, what to do next, and the
    task's status as get_task_status answers it."""

    done: Literal[False]
    message: str
    status: TaskStatus


WaitAnswer = WaitDone | WaitPending


class UsageReport(Answer):
    since: str | None
    until: str | None
    owner: str | None
    group_by: list[str]
    currency: str
    prices_as_of: str | None
    groups: list[dict[str, Any]]
    total: dict[str, Any] | None = None  # not when grouped by tag


class TimelineEntry(Answer):
    ts: str | None
    kind: str
    attempt: int | None
    from_state: str | None = Field(alias="from")
    to_state: str | None = Field(alias="to")
    detail: Any


# ---- sweeps ---------------------------------------------------------------------------------------
class SweepAnswer(Answer):
    """submit_sweep's answer: the sweep, its shards and what the whole should take and cost."""

    sweep_id: str
    tool_name: str
    shards: int
    queue: str
    submitted_at: str | None
    max_parallel: int | None
    fail_fast: int | None
    estimated_runtime_seconds: Number | None
    estimated_cost: Money
    poll_after_ms: int
    message: str
    deduplicated: bool | None = None  # only when the idempotency key found an earlier sweep


class SweepFailure(Answer):
    shard: int
    task_id: str
    state: TaskState
    error: TaskError | None


class SweepStatus(Answer):
    """get_sweep_status: the shards' states counted, the whole's progress and ETA, what they used
    and cost so far, and the first failures."""

    sweep_id: str
    tool_name: str
    shards: int
    counts: dict[str, int] = Field(description="Shards per state (states with none left out)")
    ended: int
    done: bool = Field(description="Every shard has ended")
    percent: Number = Field(description="Shards ended, plus the running shards' own percent, over all shards")
    eta_s: Number | None
    submitted_at: str | None
    stopped_at: str | None
    stop_reason: str | None
    max_parallel: int | None
    fail_fast: int | None
    usage: UsageFigures
    estimated_cost: CostSoFar
    failures: list[SweepFailure] = Field(description="The first shards that failed or timed out (at most 5)")
    poll_after_ms: int | None


class SweepCancelAnswer(Answer):
    sweep_id: str
    acknowledged: bool
    cancelled: int = Field(description="Shards this call cancelled or asked to stop")
    message: str | None = None  # only when there was nothing left to cancel


class ShardResult(Answer):
    shard: int
    task_id: str
    override: dict[str, Any] = Field(description="The inputs this shard changed from the sweep's base_inputs")
    state: TaskState
    result: Any
    error: TaskError | None
    artifacts: list[Artifact]
    completed_at: str | None


class SweepResult(Answer):
    sweep_id: str
    shards: int
    results: list[ShardResult]
    next_cursor: str | None


class SweepWaitAnswer(Answer):
    """wait_sweep: the sweep's status once every shard ended (done), or as it was when the wait
    gave up (not done, with a message saying so)."""

    done: bool = Field(description="Every shard has ended")
    message: str | None = None  # only when the wait gave up first
    status: SweepStatus


class SweepTaskResult(SweepResult):
    """A catalog call run as a sweep and one task of the tasks extension: its result, the first
    page of get_sweep_result with the sweep's status."""

    status: SweepStatus


# A catalog tool answers at once with the task it queued; run as a task of the tasks extension,
# its result (the task's tool result) is the task's, as get_task_result answers it. Called with
# the sweep `_meta`, it answers submit_sweep's answer, or, as a task, the sweep's result.
CatalogToolAnswer = DirectAnswer | TaskResult | SweepAnswer | SweepTaskResult
