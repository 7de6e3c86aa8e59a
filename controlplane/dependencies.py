"""Tasks that wait for others (`submit_task(after=[...])`): what a task's parents' states make of
it, and the errors that say so. Pure decisions; the store applies them in the transaction that
admits the child or ends a parent (docs/design/dependencies.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.errors import TaskErrorCode, task_error
from controlplane.outcomes import cancelled_error
from controlplane.states import TaskState

S = TaskState

# A parent's outcome as a child's error says it (a parent purged since is one that expired).
OUTCOMES: dict[TaskState | None, str] = {
    S.FAILED: "failed", S.TIMED_OUT: "timed out", S.CANCELLED: "was cancelled", S.EXPIRED: "expired",
    None: "expired",
}


def blocker(parents: Mapping[str, TaskState | None]) -> str | None:
    """The first parent (by id) that ended without succeeding (None: its row is gone), or None."""
    for task_id in sorted(parents):
        state = parents[task_id]
        if state in OUTCOMES:
            return task_id
    return None


def verdict(parents: Mapping[str, TaskState | None]) -> TaskState:
    """What a task waiting for `parents` (id -> state; None: gone) is now: `queued` when every one
    succeeded, `failed` (DEPENDENCY_FAILED) as soon as one ended otherwise, else `waiting`."""
    if blocker(parents) is not None:
        return S.FAILED
    if all(state == S.SUCCEEDED for state in parents.values()):
        return S.QUEUED
    return S.WAITING


def unfinished(parents: Mapping[str, TaskState | None]) -> list[str]:
    """The parents that have not succeeded, by id (what a waiting task waits for)."""
    return sorted(task_id for task_id, state in parents.items() if state != S.SUCCEEDED)


def dependency_failed(parents: Mapping[str, TaskState | None]) -> dict[str, Any]:
    """The error of a task ended because a parent did not succeed: names the parent and its outcome."""
    parent = blocker(parents)
    assert parent is not None
    outcome = OUTCOMES[parents[parent]]
    return task_error(TaskErrorCode.DEPENDENCY_FAILED,
                      f"parent task {parent} {outcome}: this task, which waited for it, will not run",
                      parent=parent, parent_state=str(parents[parent] or S.EXPIRED))


def missing_artifact(parent: str, name: str) -> dict[str, Any]:
    """The error of a task released without an artifact of a parent its inputs refer to."""
    return task_error(TaskErrorCode.DEPENDENCY_FAILED,
                      f"parent task {parent} succeeded without the artifact {name} this task's inputs refer to: "
                      "this task will not run", parent=parent, parent_state=str(S.SUCCEEDED), artifact=name)


def inputs_too_big(parent: str, name: str, size: int, message: str, hint: str) -> dict[str, Any]:
    """The error of a task released with file inputs that do not fit its scratch disk once an
    artifact of `parent` (`size` bytes) is counted: `message` and `hint` say the sizes and room."""
    return task_error(TaskErrorCode.DEPENDENCY_FAILED,
                      f"parent task {parent} succeeded with the artifact {name} of {size} bytes, and {message}: "
                      "this task will not run", hint=hint, parent=parent, parent_state=str(S.SUCCEEDED), artifact=name)


def cascade_cancelled(ancestor: str, reason: str) -> dict[str, Any]:
    """The error of a waiting task cancelled with its ancestor (`cancel_task(cascade=true)`)."""
    return cancelled_error(f"task {ancestor}, which it waited for, was cancelled ({reason})")
