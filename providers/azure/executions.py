"""A Container Apps execution as the core's job status, and the attempt it belongs to (its marker)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from azure.mgmt.appcontainers import models as aca

from controlplane_providers.jobs import JobPhase, JobStatus
from controlplane_providers.options import waiting_verdict

MARKER = "CONTROLPLANE_JOB_NAME"  # the env var that names an execution's task attempt
# Execution status -> our phase: the one table. Degraded (a replica failing while the execution
# still runs) stays RUNNING: the runner's heartbeat, not a guess, decides that it is lost. Unknown
# is waited on like a start (reported, and given up on per on_stuck).
PHASES: dict[str, JobPhase] = {
    "Processing": JobPhase.PENDING,
    "Unknown": JobPhase.PENDING,
    "Running": JobPhase.RUNNING,
    "Degraded": JobPhase.RUNNING,
    "Succeeded": JobPhase.SUCCEEDED,
    "Failed": JobPhase.FAILED,
    "Stopped": JobPhase.FAILED,
}


def execution_status(ex: Any, now: float, created_at: float | None, stuck_after_s: float, on_stuck: str) -> JobStatus:
    """One execution as the core's job status (None: Azure no longer lists it)."""
    if ex is None:
        return JobStatus(JobPhase.GONE, reason="Azure no longer lists this execution (its history is limited)",
                         raw_status="GONE")
    props = ex.properties or aca.JobExecutionProperties()
    status = str(getattr(props.status, "value", props.status) or "Unknown")
    phase = PHASES.get(status, JobPhase.PENDING)
    reason = ": ".join(p for p in (props.reason, props.message) if p) or None
    began, finished = started(ex), timestamp(props.end_time)
    waiting = give_up = None
    if phase == JobPhase.PENDING:
        waiting, give_up = waiting_verdict(status, now - (created_at or now),
                                           reason or "waiting for the execution to start",
                                           stuck_after_s=stuck_after_s,
                                           on_stuck=on_stuck, noun="execution")
    elif phase == JobPhase.RUNNING:
        began = began or now
    return JobStatus(phase, reason=reason, started_at=began, finished_at=finished, waiting_reason=waiting,
                     give_up_reason=give_up, raw_status=status)


def marker(execution: aca.JobExecution) -> str | None:
    template = execution.properties.template if execution.properties is not None else None
    for container in (template.containers if template is not None else None) or []:
        for env in container.env or []:
            if env.name == MARKER:
                return env.value
    return None


def timestamp(t: datetime | None) -> float | None:
    return t.timestamp() if isinstance(t, datetime) else None


def started(execution: Any) -> float | None:
    return timestamp(execution.properties.start_time) if execution.properties is not None else None
