"""The state machines: a task's eleven states (docs/design/task-model.md) and a job's six, each with the only table
of its legal transitions.

The store refuses any transition not listed here (`IllegalTransition`); nothing else in the
code base decides whether a state change is allowed.

    waiting ──► queued ──► scheduled ──► running ──► succeeded | failed
       │          │            │            │  ╲
       │          │            │            │   ╲─► cancelling (timeout kill) ──► timed_out
       │          │            ▼            ▼
       │          │      cancel_requested ──► cancelling ──► cancelled
       ▼          ▼
  failed | cancelled      cancelled             (terminal) ──► expired

* `waiting`: admitted, its parents (`after`) not all succeeded yet; it holds no slot and is in
  no queue. The transaction that ends its last parent queues it, or ends it `failed`
  (DEPENDENCY_FAILED) when a parent did not succeed (docs/design/dependencies.md).
* `scheduled` means a slot is held and the launch intent is recorded; the job may or may not
  exist yet at the provider.
* `scheduled|running -> queued` is a retry as the next attempt (a job lost, preempted or never
  started, a tool that failed with retries left); the attempt number goes up in the same
  transaction. A launch that fails for a transient reason is tried again within its attempt,
  the task still `scheduled`.
* `cancel_requested|cancelling -> succeeded|failed` happens when the job finished before the
  cancel reached it: its outcome is kept, and the event log records the lost race.
* Only terminal tasks expire; `expired` is final.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    WAITING = "waiting"
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    EXPIRED = "expired"


S = TaskState

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    S.WAITING: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.CANCEL_REQUESTED, S.FAILED}),
    S.RUNNING: frozenset(
        {S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCEL_REQUESTED, S.CANCELLING, S.QUEUED}
    ),
    S.CANCEL_REQUESTED: frozenset({S.CANCELLING, S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.TIMED_OUT, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset({S.EXPIRED}),
    S.FAILED: frozenset({S.EXPIRED}),
    S.CANCELLED: frozenset({S.EXPIRED}),
    S.TIMED_OUT: frozenset({S.EXPIRED}),
    S.EXPIRED: frozenset(),
}

TERMINAL: frozenset[TaskState] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
FINAL: frozenset[TaskState] = TERMINAL | {S.EXPIRED}
# States in which a task holds its queue's slot (exactly one) until it reaches a terminal state.
SLOT_HOLDING: frozenset[TaskState] = frozenset(
    {S.SCHEDULED, S.RUNNING, S.CANCEL_REQUESTED, S.CANCELLING}
)


class IllegalTransition(Exception):
    """A transition the table above does not allow; the store never applies it."""

    def __init__(self, task_id: str, current: str, target: str):
        what = task_id if task_id.startswith("job ") else f"task {task_id}"
        super().__init__(f"{what}: {current} -> {target} is not a legal transition")
        self.task_id = task_id
        self.current = current
        self.target = target


def is_legal(current: TaskState | str, target: TaskState | str) -> bool:
    return TaskState(target) in TRANSITIONS[TaskState(current)]


def check(task_id: str, current: TaskState | str, target: TaskState | str) -> None:
    if not is_legal(current, target):
        raise IllegalTransition(task_id, str(current), str(target))


# ==== jobs =====================================================================================
class JobState(StrEnum):
    """One attempt's job at its provider.

        launching ──► active ──► done
            │            │  ╲
            │            │   ╲─► draining ──► done        (the task moved on; stop it until it ends)
            ▼            ▼          │
         dropped     abandoned ◄────╯ ──► done            (it did not confirm it stopped in time)

    * `launching`: the launch intent, written before the provider is called.
    * `dropped`: the intent was given up before anything was launched (or the launch was refused).
    * `active` / `draining` / `abandoned` are watched by the reconciler; `done` and `dropped` are not.
    """

    LAUNCHING = "launching"
    ACTIVE = "active"
    DRAINING = "draining"
    ABANDONED = "abandoned"
    DONE = "done"
    DROPPED = "dropped"


J = JobState

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    J.LAUNCHING: frozenset({J.ACTIVE, J.DROPPED, J.DONE, J.DRAINING}),
    J.ACTIVE: frozenset({J.DONE, J.DRAINING, J.ABANDONED}),
    J.DRAINING: frozenset({J.DONE, J.ABANDONED}),
    J.ABANDONED: frozenset({J.DONE}),
    J.DONE: frozenset(),
    J.DROPPED: frozenset(),
}
# Jobs the reconciler polls (their job may still run at the provider).
WATCHED: frozenset[JobState] = frozenset({J.ACTIVE, J.DRAINING, J.ABANDONED})
# Jobs whose runner may still report for its attempt.
REPORTING: frozenset[JobState] = frozenset({J.LAUNCHING, J.ACTIVE})


def check_job(job_id: str, current: JobState | str, target: JobState | str) -> None:
    if JobState(target) not in JOB_TRANSITIONS[JobState(current)]:
        raise IllegalTransition(f"job {job_id}", str(current), str(target))
