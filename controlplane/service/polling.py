"""When a caller should ask about a task again (`poll_after_ms` in every answer about it)."""

from __future__ import annotations

import time
from typing import Any

from controlplane.estimates import Estimator
from controlplane.states import TaskState
from controlplane.store.rows import TaskRow
from controlplane_providers.base import Provider


def poll_after_ms(task: TaskRow, estimator: Estimator, providers: dict[str, Provider[Any]],
                  provider_name: str | None = None) -> int:
    """A tenth of the expected remaining time (the tool's own ETA while it runs, else the
    estimate), 0.5 s to 30 s; while the job is being placed, no sooner than its provider
    (`provider_name`, the attempt's job's; default the task's) looks at it again."""
    remaining = task.estimate_s or 10.0
    if task.state == TaskState.RUNNING and task.started_at:
        progress = task.progress or {}
        eta = estimator.eta(task, progress, time.time())
        remaining = eta if eta is not None else remaining
    interval = min(30.0, max(0.5, remaining / 10))
    provider = providers.get(provider_name or task.provider)
    if task.state == TaskState.SCHEDULED and provider is not None:
        interval = max(interval, min(30.0, provider.poll_interval_s / 2))
    return int(interval * 1000)
