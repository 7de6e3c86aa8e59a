"""Error codes: the public, stable table (docs/design/errors-and-cancellation.md) plus the task error kinds.

Two families:

* Call errors (`ErrorCode`) answer a tool call that could not be carried out. They reach the
  client as an `isError` result whose JSON is `{code, message, hint?}`.
* Task errors (`TaskErrorCode`) describe why a task ended badly. They are stored with the task
  and returned by get_task_result / get_task_status as `error: {code, message, ...}`.

Messages are written for the client: they never carry stack traces, paths or credentials.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    INVALID_REQUEST = "INVALID_REQUEST"
    NOT_FOUND = "NOT_FOUND"
    CAPABILITY_MISSING = "CAPABILITY_MISSING"
    QUEUE_OVERLOADED = "QUEUE_OVERLOADED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"
    UNAUTHORIZED = "UNAUTHORIZED"
    FORBIDDEN = "FORBIDDEN"
    # A limit of this caller (submits per minute or day, tasks in flight, streaming waits): the
    # error carries `limit`, `max` and `retry_after_s` (controlplane.limits).
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    # complete_upload found the bytes sent differ from the size or sha256 promised: the object is
    # deleted, and so is the upload (create_upload starts afresh).
    UPLOAD_MISMATCH = "UPLOAD_MISMATCH"
    # complete_upload came before every byte was sent: nothing is lost, send the rest.
    UPLOAD_INCOMPLETE = "UPLOAD_INCOMPLETE"
    # submit_sweep asked for more shards than CONTROLPLANE_SWEEP_MAX_SHARDS: nothing was written;
    # the error carries `shards` and `max`.
    SWEEP_TOO_LARGE = "SWEEP_TOO_LARGE"


class TaskErrorCode(StrEnum):
    TOOL_FAILED = "TOOL_FAILED"  # the tool exited non-zero or reported an error
    TOOL_TIMEOUT = "TOOL_TIMEOUT"  # max_runtime_s passed; the job was killed (timeoutMs set)
    CANCELLED = "CANCELLED"  # cancelled by its owner
    WORKER_LOST = "WORKER_LOST"  # the job vanished or stopped heartbeating, retries exhausted
    LAUNCH_FAILED = "LAUNCH_FAILED"  # the provider refused to start the job
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"  # a parent (`after`) failed, timed out, expired or was cancelled
    # The runner could not read the task's inputs or input files before the tool started (a file
    # gone, or not the bytes admission recorded): the reason is in the task's log, not the error.
    INPUTS_UNREADABLE = "INPUTS_UNREADABLE"
    INTERNAL = "INTERNAL"


class ControlPlaneError(Exception):
    """An error that is safe to show to the client as `{code, message, hint}`."""

    def __init__(self, code: ErrorCode, message: str, hint: str | None = None, **extra: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": str(self.code), "message": self.message}
        if self.hint:
            d["hint"] = self.hint
        d.update(self.extra)
        return d


def invalid(message: str, hint: str | None = None, **extra: Any) -> ControlPlaneError:
    return ControlPlaneError(ErrorCode.INVALID_REQUEST, message, hint, **extra)


BY_REFERENCE = "pass large data by reference (a URL or object key) instead of inline"


def too_large(message: str, **extra: Any) -> ControlPlaneError:
    """Something a caller sent is over a size limit (inputs, a request body): INVALID_REQUEST,
    with the hint to pass large data by reference."""
    return ControlPlaneError(ErrorCode.INVALID_REQUEST, message, BY_REFERENCE, **extra)


def not_found(what: str = "task") -> ControlPlaneError:
    # One answer for unknown, expired-and-purged and someone else's: nothing to learn from it.
    return ControlPlaneError(ErrorCode.NOT_FOUND, f"{what} not found")


def task_error(code: TaskErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"code": str(code), "message": message}
    d.update({k: v for k, v in extra.items() if v is not None})
    return d
