"""The canonical tool inputs (docs/design/task-model.md), as strict pydantic models.

These models are the input schemas the MCP surface publishes, and the validation it applies:
unknown fields are rejected (docs/design/errors-and-cancellation.md), types are strict (no "5" for 5), and every
field either changes behaviour or does not exist.

`json_problem` is the rule every value of every MCP request obeys before anything looks at it
(`controlplane.mcp.guard`): it is JSON (RFC 8259) and nothing more, so it can be stored, sent to
a runner and returned as it came.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from controlplane.states import TaskState


def iso(ts: float | None) -> str | None:
    """A timestamp as every answer writes it: RFC 3339 in UTC, to the millisecond (what
    `datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")` writes, microseconds
    rounded half-even, then cut to milliseconds; a test holds the two equal). Built from the
    whole second, cached, and the milliseconds: a page of list_tasks writes 800 of these, and
    the datetime round trip took a third of the page."""
    if ts is None:
        return None
    frac, whole = math.modf(ts)
    us, second = round(frac * 1e6), int(whole)
    if us < 0:
        us, second = us + 1_000_000, second - 1
    elif us >= 1_000_000:
        us, second = us - 1_000_000, second + 1
    return f"{_iso_second(second)}.{us // 1000:03d}Z"


@lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).replace(tzinfo=None).isoformat()  # (strftime's %Y: "1", not "0001")


def _no_nul(text: str | None) -> str | None:
    if text is not None and "\x00" in text:
        raise PydanticCustomError("nul", "must not contain NUL (U+0000): no text the server keeps can hold it")
    return text


TaskId = Annotated[str, Field(min_length=4, max_length=64, description="The task id returned by submit_task")]
# What a submit's `after` may hold at all; the server's own limit (`Settings.max_parents`) is at most this.
MAX_PARENTS_ACCEPTED = 1000
Tag = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
# Text the store keeps or looks up as it is (a tool's inputs are kept as JSON, where NUL is written
# \u0000 and reaches the tool intact; PostgreSQL's text cannot hold it, so it is refused everywhere
# else on every engine alike). A task id with NUL is simply no task (`store.tasks.could_be_task_id`).
NO_NUL = r"^[^\x00]*$"  # what the published schema says of such text (the validator's message is clearer)


class _StoredText(AfterValidator):
    """`_no_nul`, stated in the published schema too (on the string branch of an optional field),
    so that a client that validates before sending is never refused for it."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") == "string":
                branch["pattern"] = NO_NUL
        return schema  # type: ignore[no-any-return]


StoredText = _StoredText(_no_nul)


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Resources(_Input):
    resource_class: str | None = Field(default=None, max_length=64,
                                       description="Queue to run in (default: the tool's resource class)")
    max_runtime_s: int | None = Field(default=None, ge=1, description="Kill the task after this many seconds of "
                                      "running (default: the tool's default, capped at its max)")
    cpu: float | None = Field(default=None, gt=0, description="vCPUs (at most the resource class's)")
    memory_mb: int | None = Field(default=None, gt=0, description="Memory in MiB (at most the resource class's)")
    gpu: int | None = Field(default=None, ge=0, description="GPUs (at most the resource class's)")
    scratch_mb: int | None = Field(default=None, ge=0, description="Scratch disk in MiB the job must have: "
                                   "refused unless the tool's provider can guarantee it (and at most the class's "
                                   "scratch_mb)")


class SubmitTask(_Input):
    tool_name: str = Field(min_length=1, max_length=128, description="A tool of the catalog")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The tool's inputs, per its input schema")
    resources: Resources | None = Field(default=None, description="Resource requests and limits")
    ttl_s: int | None = Field(default=None, ge=60, description="Keep the task, its logs and artifacts this many "
                              "seconds after it finishes")
    idempotency_key: Annotated[str | None, StoredText] = Field(
        default=None, min_length=1, max_length=200, description="A repeated submit with the same key (per caller and "
        "tool) returns the existing task instead of creating another")
    priority: int = Field(default=0, ge=-100, le=100, description="Higher runs first; FIFO within a priority")
    tags: list[Tag] = Field(default_factory=list, max_length=32, description="Labels to filter list_tasks by")
    after: list[TaskId] = Field(default_factory=list, max_length=MAX_PARENTS_ACCEPTED, description=(
        "Tasks (yours, or ones you may read) this one waits for: it is admitted at once as 'waiting', queued "
        "when every one of them has succeeded, and ends DEPENDENCY_FAILED if one fails, times out, expires or "
        "is cancelled. At most CONTROLPLANE_MAX_PARENTS (64 by default)"))


class GetTaskStatus(_Input):
    task_id: TaskId


class TailTaskLogs(_Input):
    task_id: TaskId
    cursor: str | None = Field(default=None, max_length=1024,
                               description="next_cursor of the previous page; omit to start at the beginning")
    limit: int = Field(default=200, ge=1, le=1000, description="Lines per page")
    from_end: bool = Field(default=False, description="Return the last `limit` lines (not with a cursor); its "
                           "next_cursor then follows the log from there")
    source: Literal["task", "provider"] = Field(
        default="task", description="'task': the lines the runner relayed (every provider); 'provider': the job "
        "runner's own log of the current attempt (CloudWatch for AWS Batch, the process console locally), "
        "which also shows what happened before the runner started")


class ListTasks(_Input):
    states: list[TaskState] | None = Field(default=None, max_length=10, description="Only tasks in these states")
    tool_name: Annotated[str | None, StoredText] = Field(default=None, max_length=128)
    tags_any: list[Tag] | None = Field(default=None, max_length=32, description="Tasks with any of these tags")
    submitted_after: datetime | None = Field(default=None, description="ISO 8601 time")
    submitted_before: datetime | None = Field(default=None, description="ISO 8601 time")
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(default=None, max_length=64, description="next_cursor of the previous page")
    owner: Annotated[str | None, StoredText] = Field(default=None, min_length=1, max_length=200,
                              description="Whose tasks (default: yours). With tasks:admin anyone's; with a team, "
                                          "a teammate's tasks shared with your team; otherwise none")
    everyone: bool = Field(default=False, description="Every owner's tasks, newest first, each with its owner "
                           "(tasks:admin only)")
    parent: Annotated[str | None, StoredText] = Field(default=None, min_length=4, max_length=64,
                                                      description="Only the tasks submitted with this task in their "
                                                                  "`after` (its children)")
    sweep: Annotated[str | None, StoredText] = Field(default=None, min_length=4, max_length=64,
                                                     description="Only the shards of this sweep (submit_sweep's "
                                                                 "sweep_id)")
    whole_sweeps: bool = Field(default=False, description="A sweep's shards take one row, with its sweep_id, "
                               "state, percent and shard counts (get_sweep_status says the rest); ignored with sweep")


class CancelTask(_Input):
    task_id: TaskId
    reason: Annotated[str, StoredText] = Field(default="user-request", min_length=1, max_length=500)
    cascade: bool = Field(default=False, description="Also cancel the tasks waiting for this one, and theirs "
                          "(without it they end DEPENDENCY_FAILED)")


class WaitTask(_Input):
    task_id: TaskId
    timeout_s: float = Field(default=60, gt=0, le=3600, description="Give up waiting (not the task) after this "
                             "many seconds")


class GetTaskResult(_Input):
    task_id: TaskId
    url_ttl_s: int | None = Field(default=None, ge=60, description="Lifetime of the artifact download links "
                                  "(default from the server's settings, capped at 7 days)")


class UsageReport(_Input):
    group_by: list[Literal["tool", "tag", "owner"]] = Field(
        default=["tool"], max_length=3, json_schema_extra={"uniqueItems": True}, description="Sum per tool, tag and/or owner (a task counts under each of "
        "its tags; [] for one total)")
    since: datetime | None = Field(default=None, description="ISO 8601 time: attempts that ended at or after it "
                                   "(default: the start of the current month, UTC)")
    until: datetime | None = Field(default=None, description="ISO 8601 time: attempts that ended before it "
                                   "(default: now)")
    owner: Annotated[str | None, StoredText] = Field(default=None, min_length=1, max_length=200,
                              description="Whose usage (default: yours); anyone's with tasks:admin")
    everyone: bool = Field(default=False, description="Everyone's usage (tasks:admin only)")

    @field_validator("group_by")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each of tool, tag and owner at most once")
        return v


class CreateUpload(_Input):
    name: str = Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f\\]+$",
                      description="The file's name (a relative path of safe segments; none starting with '.')")
    size_bytes: int = Field(ge=0, le=5 * 1024**4, description="The file's exact size in bytes")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="The file's SHA-256, 64 lowercase hex digits")
    content_type: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[!-~]+/[!-~]+$",
                                     description="Its media type (default: guessed from the name)")


class CompleteUpload(_Input):
    upload_id: str = Field(min_length=5, max_length=40, pattern=r"^upl_[0-9a-z]+$",
                           description="The upload id create_upload returned")


SweepId = Annotated[str, Field(min_length=4, max_length=64, description="The sweep id returned by submit_sweep")]


class Vary(_Input):
    """How a sweep's shards differ: exactly one of `list` and `grid`."""

    overrides: list[dict[str, Any]] | None = Field(
        default=None, alias="list", min_length=1,
        description="One shard per item, in this order: each an object of inputs that replace the base's")
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = Field(
        default=None, min_length=1,
        description="One shard per combination of these inputs' values: the product of the lists in the "
                    "order of the keys as given (the first key varies slowest)")

    @model_validator(mode="after")
    def _one_form(self) -> Vary:
        if (self.overrides is None) == (self.grid is None):
            raise ValueError("give exactly one of list and grid")
        return self

    def as_json(self) -> dict[str, Any]:
        """The JSON form as the caller gave it (`{"list": [...]}` or `{"grid": {...}}`)."""
        return {"list": self.overrides} if self.overrides is not None else {"grid": self.grid}


class SubmitSweep(_Input):
    tool_name: str = Field(min_length=1, max_length=128, description="A tool of the catalog")
    base_inputs: dict[str, Any] = Field(default_factory=dict, description="The inputs every shard shares")
    vary: Vary = Field(description='How the shards differ: {"list": [override, ...]} (one shard per override) '
                       'or {"grid": {"name": [values], ...}} (one shard per combination, first key slowest). A '
                       "shard's inputs are base_inputs with its override applied (shallow)")
    resources: Resources | None = Field(default=None, description="Resource requests and limits of every shard")
    ttl_s: int | None = Field(default=None, ge=60, description="Keep each shard this long after it finishes")
    idempotency_key: Annotated[str | None, StoredText] = Field(
        default=None, min_length=1, max_length=200, description="A repeated submit with the same key (per caller and "
        "tool) returns the existing sweep instead of creating another")
    priority: int = Field(default=0, ge=-100, le=100, description="Every shard's priority")
    tags: list[Tag] = Field(default_factory=list, max_length=32, description="Every shard's tags")
    after: list[TaskId] = Field(default_factory=list, max_length=MAX_PARENTS_ACCEPTED,
                                description="Tasks every shard waits for (as submit_task's after)")
    max_parallel: int | None = Field(default=None, ge=1, description="At most this many shards hold a slot at "
                                     "once (default: as many as the queue gives)")
    fail_fast: int | None = Field(default=None, ge=1, description="Cancel the shards not yet ended once this "
                                  "many have failed (after their own retries); default: run them all")


class GetSweepStatus(_Input):
    sweep_id: SweepId


class WaitSweep(_Input):
    sweep_id: SweepId
    timeout_s: float = Field(default=60, gt=0, le=3600, description="Give up waiting (not the sweep) after this "
                             "many seconds")


class CancelSweep(_Input):
    sweep_id: SweepId
    reason: Annotated[str, StoredText] = Field(default="user-request", min_length=1, max_length=500)


class GetSweepResult(_Input):
    sweep_id: SweepId
    cursor: str | None = Field(default=None, max_length=64, description="next_cursor of the previous page")
    limit: int = Field(default=50, ge=1, le=200, description="Shards per page")
    url_ttl_s: int | None = Field(default=None, ge=60, description="Lifetime of the artifact download links")


# ---- JSON values ------------------------------------------------------------------------------------
MAX_JSON_DEPTH = 100  # nesting levels of one argument (the 2025-11-25 wire parses at most 200 in all)
NOT_FINITE = "not a finite number (NaN and Infinity are not JSON)"
NOT_UNICODE = "not valid Unicode text (it holds a lone surrogate)"
TOO_DEEP = f"nested more than {MAX_JSON_DEPTH} levels deep"


def _is_unicode(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_problem(value: Any) -> tuple[list[str | int], str] | None:
    """The first part of `value` that JSON cannot carry as it is, as (path, problem): a number
    that is not finite (NaN, Infinity: Python's parsers read them, JSON has none), text that is
    not Unicode (a lone surrogate such as "\\ud800": it cannot be encoded, stored or sent on),
    an object key of that kind, or nesting deeper than MAX_JSON_DEPTH. None when there is none.

    Iterative, so that no depth of nesting can exhaust the stack it runs on."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _is_unicode(v):
                return path, NOT_UNICODE
        elif isinstance(v, float):
            if not math.isfinite(v):
                return path, NOT_FINITE
        elif isinstance(v, dict | list):
            if len(path) >= MAX_JSON_DEPTH:
                return path[:1], TOO_DEEP  # named by the argument that holds it
            items = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
            for key, item in reversed(items):  # the first item is looked at first
                if isinstance(key, str) and not _is_unicode(key):  # named with escapes: no answer can carry it
                    return [*path, key.encode("utf-8", "backslashreplace").decode()], NOT_UNICODE
                stack.append(([*path, key], item))
    return None


def dotted(path: list[str | int], prefix: str = "") -> str:
    """A path as the messages name fields: `inputs.frames.2`."""
    return ".".join(map(str, [prefix, *path] if prefix else path)) or "(arguments)"
