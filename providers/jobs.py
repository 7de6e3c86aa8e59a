"""What the control plane hands a provider (`LaunchSpec`, `Shape`) and what it answers
(`JobStatus`, `LogPage`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controlplane_providers.options import ProviderOptions


class JobPhase(StrEnum):
    PENDING = "pending"  # accepted, waiting for capacity or starting
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the runner exited 0
    FAILED = "failed"  # the runner exited non-zero, or the provider stopped it
    GONE = "gone"  # the provider does not know this job (any more)


@dataclass(frozen=True)
class Shape:
    """What a job may be given: cpu, memory, GPUs and the provider's options. For a submit's
    check it is the resource class's (the most a task of the class may have); in `launch` it is
    the task's own (`LaunchSpec.shape`)."""

    resource_class: str
    cpu: float
    memory_mb: int
    gpu: int
    options: Any = field(default_factory=ProviderOptions)


@dataclass(frozen=True)
class LaunchSpec:
    task_id: str
    attempt: int
    job_name: str  # deterministic: controlplane.ids.job_name(task_id, attempt)
    tool_name: str
    owner: str
    command: tuple[str, ...]  # the tool's command; the provider wraps it with the runner
    image: str | None
    env: dict[str, str]  # the runner's environment (CONTROLPLANE_*), plus the tool's own env
    cpu: float
    memory_mb: int
    gpu: int
    scratch_mb: int  # scratch disk the task asked for (resources.scratch_mb); 0: none asked
    max_runtime_s: int
    resource_class: str
    # The provider's `Options`: resource class + tool provider_options, validated at catalog load.
    options: Any = field(default_factory=ProviderOptions)

    @property
    def shape(self) -> Shape:
        return Shape(self.resource_class, self.cpu, self.memory_mb, self.gpu, self.options)


@dataclass(frozen=True)
class JobStatus:
    phase: JobPhase
    reason: str | None = None  # provider's words: statusReason, execution reason, ...
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # Set while PENDING when the job waits on something that may never come (no capacity, an
    # image that cannot be pulled). The control plane shows it in get_task_status.
    waiting_reason: str | None = None
    # Set when the provider's policy says to stop waiting: the control plane stops the job and
    # fails the attempt (LAUNCH_FAILED) instead of holding its slot for ever.
    give_up_reason: str | None = None
    raw_status: str | None = None  # the provider's own status word
    # An ended job's last console lines, from a provider whose log lives only as long as the job
    # (the local provider's console.log): the control plane copies them into the task's logs and
    # error when the runner reported no outcome. Cloud providers keep their log service instead.
    last_output: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogLine:
    ts: float
    message: str
    stream: str = "stdout"


@dataclass(frozen=True)
class LogPage:
    lines: list[LogLine]
    next_cursor: str | None
    reason: str | None = None  # e.g. "log stream not created yet"
