"""A Cloud Run execution as the core's job status, and the attempt it belongs to (its marker)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.cloud import run_v2

from controlplane_providers.jobs import JobPhase, JobStatus
from controlplane_providers.options import waiting_verdict

MARKER = "CONTROLPLANE_JOB_NAME"  # the env var that names an execution's task attempt
_COND = run_v2.Condition.State
_REASON = run_v2.Condition.ExecutionReason
# The Completed condition (state, execution reason) -> our phase and the status word we show.
# An execution without a final Completed condition is RUNNING while a task runs or once one has
# run (its tasks may have ended while Completed is still reconciling), else PENDING.
PHASES: dict[tuple[int, int | None], tuple[JobPhase, str]] = {
    (_COND.CONDITION_SUCCEEDED, None): (JobPhase.SUCCEEDED, "SUCCEEDED"),
    (_COND.CONDITION_FAILED, _REASON.NON_ZERO_EXIT_CODE): (JobPhase.FAILED, "FAILED"),
    (_COND.CONDITION_FAILED, _REASON.CANCELLED): (JobPhase.FAILED, "CANCELLED"),
    (_COND.CONDITION_FAILED, _REASON.DELETED): (JobPhase.GONE, "DELETED"),
    (_COND.CONDITION_FAILED, None): (JobPhase.FAILED, "FAILED"),
}


def timestamp(t: Any) -> float | None:
    """A proto timestamp (DatetimeWithNanoseconds, or unset) as epoch seconds."""
    if t is None:
        return None
    if isinstance(t, datetime):
        return t.timestamp() if t.year > 1970 else None
    return None


def execution_status(ex: Any, now: float, stuck_after_s: float, on_stuck: str) -> JobStatus:
    """One execution as the core's job status, through the table above. Before Completed is
    final: RUNNING while a task runs or once one has run (ENDING: its tasks ended, the
    condition is still reconciling), else PENDING, aged from the execution's creation."""
    completed = next((c for c in ex.conditions if c.type_ == "Completed"), None)
    state = int(completed.state) if completed is not None else _COND.CONDITION_PENDING
    reason_code = int(completed.execution_reason) if completed is not None else 0
    message = completed.message if completed is not None else ""
    started, finished = timestamp(ex.start_time), timestamp(ex.completion_time)
    if state in (_COND.CONDITION_SUCCEEDED, _COND.CONDITION_FAILED):
        phase, word = PHASES.get((state, reason_code)) or PHASES[(state, None)]
        why = _REASON(reason_code).name if reason_code else None
        reason = ": ".join(p for p in (why, message) if p) or None
        return JobStatus(phase, reason=reason, started_at=started, finished_at=finished, raw_status=word)
    if ex.running_count > 0 or reason_code == _REASON.CANCELLING:
        word = "CANCELLING" if reason_code == _REASON.CANCELLING else "RUNNING"
        return JobStatus(JobPhase.RUNNING, reason=message or None, started_at=started or now, raw_status=word)
    if ex.succeeded_count or ex.failed_count or ex.cancelled_count or started:
        # Its tasks ran (and, with none running, ended) while Completed is still reconciling:
        # the execution is ending, not waiting to start.
        ended = bool(ex.succeeded_count or ex.failed_count or ex.cancelled_count)
        return JobStatus(JobPhase.RUNNING, reason=message or None, started_at=started or now,
                         raw_status="ENDING" if ended else "RUNNING")
    waiting, give_up = waiting_verdict("PENDING", now - (timestamp(ex.create_time) or now),
                                       message or "waiting for the execution to start",
                                       stuck_after_s=stuck_after_s, on_stuck=on_stuck, noun="execution")
    return JobStatus(JobPhase.PENDING, reason=message or None, waiting_reason=waiting, give_up_reason=give_up,
                     raw_status="PENDING")


def marker(execution: run_v2.Execution) -> str | None:
    for container in execution.template.containers:
        for env in container.env:
            if env.name == MARKER:
                return env.value
    return None
