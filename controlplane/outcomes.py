"""How a finished attempt ends its task: the one place that turns a job's outcome into a state.

Pure functions, no I/O: given the task as stored and what the job reported (or what the provider
says when the job could not report), decide the target state, the error, and whether the failure
earns another attempt under the tool's retry policy.

Two retry budgets, counted apart (SkyPilot's habit): a tool that failed (`tool_failed`) may run
again while `failures + 1 < max_attempts`; a job that was lost, preempted or could not be
launched (`worker_lost`, `launch_failed`: the infrastructure's fault, not the tool's) is
recovered while `recoveries < max_recoveries`. Either only if the policy's `retry_on` names the
kind. The wait before the next attempt is `backoff_delay`: exponential, capped, with jitter.

A launch its placement refused for capacity, where the tool has other placements, is neither:
the task is queued again to run elsewhere (`decide_elsewhere`), spending no budget.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from controlplane.errors import TaskErrorCode, task_error
from controlplane.states import TaskState
from controlplane_runner.events import INPUTS_UNREADABLE

if TYPE_CHECKING:
    from controlplane.catalog import RetryPolicy
    from controlplane.store.rows import JobRow, TaskRow

# Which budget each retryable failure draws on.
BUDGET = {"tool_failed": "failure", "worker_lost": "recovery", "launch_failed": "recovery"}
MAX_BACKOFF_S = 600.0
INPUTS_UNREADABLE_MESSAGE = ("the task's inputs could not be read before the tool started "
                             "(the task's log says why)")


@dataclass(frozen=True)
class Decision:
    state: TaskState  # the terminal state, or QUEUED for a retry
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    note: str | None = None  # recorded in the task event (e.g. "cancel lost the race")
    backoff_s: float = 0.0  # for a retry: how long the task waits before its next attempt
    retry: str | None = None  # for a retry: the budget it draws on ("failure", "recovery"), or "elsewhere" (none)

    @property
    def is_retry(self) -> bool:
        return self.state == TaskState.QUEUED


def backoff_delay(base_s: float, n: int, *, cap_s: float = MAX_BACKOFF_S, rng: random.Random | None = None) -> float:
    """The wait before the `n`-th retry (1-based) of one budget: `base_s * 2**(n-1)`, at most
    `cap_s`, with "equal jitter": half of it fixed, the other half uniformly random, so that the
    tasks one outage failed together do not all come back in the same instant, and none comes
    back sooner than half its delay. (Hand-written: tenacity's waits need a RetryCallState.)"""
    delay: float = min(cap_s, base_s * 2 ** max(0, n - 1))
    jitter = rng.uniform(0, delay / 2) if rng is not None else random.uniform(0, delay / 2)
    return delay / 2 + jitter


def _retry_or(task: TaskRow, kind: str, policy: RetryPolicy, terminal: Decision) -> Decision:
    budget = BUDGET[kind]
    if kind not in policy.retry_on:
        return terminal
    if budget == "failure" and task.failures + 1 < task.max_attempts:
        n = task.failures + 1
    elif budget == "recovery" and task.recoveries < task.max_recoveries:
        n = task.recoveries + 1
    else:
        return terminal
    return Decision(TaskState.QUEUED, error=terminal.error, note=f"retry after {kind}",
                    backoff_s=backoff_delay(policy.backoff_s, n), retry=budget)


def timeout_error(task: TaskRow) -> dict[str, Any]:
    return task_error(TaskErrorCode.TOOL_TIMEOUT, f"the task exceeded its max runtime of {task.max_runtime_s} s",
                      timeoutMs=int(task.max_runtime_s) * 1000)


def cancelled_error(reason: str | None) -> dict[str, Any]:
    return task_error(TaskErrorCode.CANCELLED, f"cancelled: {reason or 'cancelled by request'}")


def decide(task: TaskRow, outcome: dict[str, Any], policy: RetryPolicy) -> Decision:
    """`outcome` is the runner's report: {status, exit_code, signal, error, result, stop_reason}."""
    stopping = task.state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING)
    status = outcome.get("status")
    result = outcome.get("result") if isinstance(outcome.get("result"), dict) else None

    if status == "succeeded":
        note = "the job finished before the cancel reached it" if stopping else None
        return Decision(TaskState.SUCCEEDED, result=result, note=note)

    if stopping or task.stop_reason:
        if task.stop_reason == "timeout":
            return Decision(TaskState.TIMED_OUT, error=timeout_error(task), result=result)
        return Decision(TaskState.CANCELLED, error=cancelled_error(task.cancel_reason), result=result)

    if status == "cancelled":
        # Stopped by someone other than us (node shutdown, spot reclaim, an operator): the work
        # was lost, not refused.
        lost = task_error(TaskErrorCode.WORKER_LOST, "the job was stopped from outside the control plane",
                          signal=outcome.get("signal"))
        return _retry_or(task, "worker_lost", policy, Decision(TaskState.FAILED, error=lost))

    code = outcome.get("exit_code")
    if outcome.get("error") == INPUTS_UNREADABLE and code is None:  # why is in the task's log, not here
        err = task_error(TaskErrorCode.INPUTS_UNREADABLE, INPUTS_UNREADABLE_MESSAGE)
        return _retry_or(task, "tool_failed", policy, Decision(TaskState.FAILED, error=err))
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


def decide_lost(task: TaskRow, reason: str, policy: RetryPolicy) -> Decision:
    """The job is gone or silent and left no outcome behind."""
    if task.state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING):
        if task.stop_reason == "timeout":
            return Decision(TaskState.TIMED_OUT, error=timeout_error(task))
        return Decision(TaskState.CANCELLED, error=cancelled_error(task.cancel_reason))
    err = task_error(TaskErrorCode.WORKER_LOST, f"the job was lost: {reason}")
    return _retry_or(task, "worker_lost", policy, Decision(TaskState.FAILED, error=err))


def decide_launch_failure(task: TaskRow, message: str, policy: RetryPolicy) -> Decision:
    """The job never ran: the provider refused it, or it waited for capacity past its limit."""
    err = task_error(TaskErrorCode.LAUNCH_FAILED, message)
    return _retry_or(task, "launch_failed", policy, Decision(TaskState.FAILED, error=err))


def decide_elsewhere(task: TaskRow, message: str, policy: RetryPolicy, *, refusals: int,
                     placements: int) -> Decision:
    """The attempt's placement had no room for its job (nothing started) and the tool has
    `placements` of them: the task is queued again for the next attempt to run elsewhere,
    spending no retry budget. The first refusals of a round of the placements retry at once;
    once `refusals` in a row have come round them all, the task waits `backoff_delay` (per
    round), so that a task every placement refuses does not spin."""
    if task.state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING):
        return Decision(TaskState.CANCELLED, error=cancelled_error(task.cancel_reason))
    rounds = refusals // max(1, placements)
    wait = backoff_delay(max(policy.backoff_s, 1.0), rounds) if rounds else 0.0
    return Decision(TaskState.QUEUED, note=f"retry elsewhere: {message}", backoff_s=wait, retry="elsewhere")


def refusals_in_a_row(earlier: Sequence[JobRow], status: str) -> int:
    """The refusal now and those just before it: the task's earlier attempts' jobs (oldest first)
    whose provider status is `status` (their placement had no room), counted back from the last."""
    n = 1
    for j in reversed(earlier):
        if j.provider_status != status:
            break
        n += 1
    return n


def decide_provider_failure(task: TaskRow, reason: str | None, exit_code: int | None,
                            policy: RetryPolicy, *, started: bool = True) -> Decision:
    """The provider says the job failed and the runner left no outcome: the job never started
    (an image that cannot be pulled, a bad job definition: LAUNCH_FAILED), or its container was
    killed before the runner could report (WORKER_LOST), or the tool's exit code is all we have."""
    if task.state in (TaskState.CANCEL_REQUESTED, TaskState.CANCELLING):
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


# How much of a job's last output its error quotes (the task's logs keep all of it).
OUTPUT_LINES = 3
OUTPUT_CHARS = 600


def with_output(d: Decision, output: tuple[str, ...]) -> Decision:
    """`d` with its error quoting the last lines the job printed (a runner that died before it
    could report says why only there): at most OUTPUT_LINES lines and OUTPUT_CHARS characters."""
    if d.error is None or not output:
        return d
    quoted = " | ".join(line.strip() for line in output[-OUTPUT_LINES:])
    if len(quoted) > OUTPUT_CHARS:
        quoted = "..." + quoted[-OUTPUT_CHARS:]
    return replace(d, error={**d.error, "message": f"{d.error['message']}; its last output: {quoted}"})
