"""How a finished attempt ends its task: the one place that turns a job's outcome into a state.

Pure functions, no I/O: given the task as stored and what the job reported (or what the provider
says when the job could not report), decide the target state, the error, and whether the failure
earns another attempt under the tool's retry policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.errors import TaskErrorCode, task_error
from controlplane.states import TaskState

if TYPE_CHECKING:
    from controlplane.catalog import RetryPolicy


@dataclass(frozen=True)
class Decision:
    state: TaskState  # the terminal state, or QUEUED for a retry
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    note: str | None = None  # recorded in the task event (e.g. "cancel lost the race")
    backoff_s: float = 0.0  # for a retry: how long the task waits before its next attempt

    @property
    def is_retry(self) -> bool:
        return self.state == TaskState.QUEUED


def _retry_or(task: dict[str, Any], kind: str, policy: RetryPolicy, terminal: Decision) -> Decision:
    if kind in policy.retry_on and task["attempt"] < task["max_attempts"]:
        return Decision(TaskState.QUEUED, error=terminal.error, note=f"retry after {kind}",
                        backoff_s=policy.backoff_s * (2 ** (task["attempt"] - 1)))
    return terminal


def timeout_error(task: dict[str, Any]) -> dict[str, Any]:
    return task_error(TaskErrorCode.TOOL_TIMEOUT, f"the task exceeded its max runtime of {task['max_runtime_s']} s",
                      timeoutMs=int(task["max_runtime_s"]) * 1000)


def cancelled_error(task: dict[str, Any]) -> dict[str, Any]:
    reason = task.get("cancel_reason") or "cancelled by request"
    return task_error(TaskErrorCode.CANCELLED, f"cancelled: {reason}")


def decide(task: dict[str, Any], outcome: dict[str, Any], policy: RetryPolicy) -> Decision:
    """`outcome` is the runner's report: {status, exit_code, signal, error, result, stop_reason}."""
    state = TaskState(task["state"])
    stopping = state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING)
    status = outcome.get("status")
    result = outcome.get("result") if isinstance(outcome.get("result"), dict) else None

    if status == "succeeded":
        note = "the job finished before the cancel reached it" if stopping else None
        return Decision(TaskState.SUCCEEDED, result=result, note=note)

    if stopping or task.get("stop_reason"):
        if task.get("stop_reason") == "timeout":
            return Decision(TaskState.TIMED_OUT, error=timeout_error(task), result=result)
        return Decision(TaskState.CANCELLED, error=cancelled_error(task), result=result)

    if status == "cancelled":
        # Stopped by someone other than us (node shutdown, spot reclaim, an operator): the work
        # was lost, not refused.
        lost = task_error(TaskErrorCode.WORKER_LOST, "the job was stopped from outside the control plane",
                          signal=outcome.get("signal"))
        return _retry_or(task, "worker_lost", policy, Decision(TaskState.FAILED, error=lost))

    code = outcome.get("exit_code")
    if outcome.get("error") and code is None:
        message = f"the job failed before the tool ran: {outcome['error']}"
    elif outcome.get("signal"):
        message = f"the tool was killed by {outcome['signal']}"
    elif outcome.get("error"):
        message = f"{outcome['error']} (exit code {code})"
    else:
        message = f"the tool exited with code {code}"
    err = task_error(TaskErrorCode.TOOL_FAILED, message, exit_code=code, signal=outcome.get("signal"))
    return _retry_or(task, "tool_failed", policy, Decision(TaskState.FAILED, error=err, result=result))


def decide_lost(task: dict[str, Any], reason: str, policy: RetryPolicy) -> Decision:
    """The job is gone or silent and left no outcome behind."""
    state = TaskState(task["state"])
    if state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING):
        if task.get("stop_reason") == "timeout":
            return Decision(TaskState.TIMED_OUT, error=timeout_error(task))
        return Decision(TaskState.CANCELLED, error=cancelled_error(task))
    err = task_error(TaskErrorCode.WORKER_LOST, f"the job was lost: {reason}")
    return _retry_or(task, "worker_lost", policy, Decision(TaskState.FAILED, error=err))


def decide_launch_failure(task: dict[str, Any], message: str, policy: RetryPolicy) -> Decision:
    """The job never ran: the provider refused it, or it waited for capacity past its limit."""
    err = task_error(TaskErrorCode.LAUNCH_FAILED, message)
    return _retry_or(task, "launch_failed", policy, Decision(TaskState.FAILED, error=err))


def decide_provider_failure(task: dict[str, Any], reason: str | None, exit_code: int | None,
                            policy: RetryPolicy, *, started: bool = True) -> Decision:
    """The provider says the job failed and the runner left no outcome: the job never started
    (an image that cannot be pulled, a bad job definition: LAUNCH_FAILED), or its container was
    killed before the runner could report (WORKER_LOST), or the tool's exit code is all we have."""
    state = TaskState(task["state"])
    if state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING):
        return decide_lost(task, reason or "stopped", policy)
    if reason and "timeout" in reason.lower():
        return Decision(TaskState.TIMED_OUT, error=timeout_error(task))
    if not started:
        return decide_launch_failure(task, f"the job never started: {reason or 'no reason given'}", policy)
    msg = f"the job failed: {reason or 'no reason given'}" + (f" (exit code {exit_code})" if exit_code is not None else "")
    if exit_code is None:
        err = task_error(TaskErrorCode.WORKER_LOST, msg)
        return _retry_or(task, "worker_lost", policy, Decision(TaskState.FAILED, error=err))
    err = task_error(TaskErrorCode.TOOL_FAILED, msg, exit_code=exit_code)
    return _retry_or(task, "tool_failed", policy, Decision(TaskState.FAILED, error=err))
