"""cancel_task: the caller's own task, or any for an administrator (recorded in its audit)."""

from __future__ import annotations

from collections.abc import Callable

from controlplane import api, dependencies
from controlplane.errors import not_found
from controlplane.ops import metrics
from controlplane.outcomes import cancelled_error
from controlplane.service.access import Access
from controlplane.service.answers import CancelAnswer
from controlplane.states import TaskState
from controlplane.store import Store
from controlplane.store.rows import TaskRow


class Cancels:
    def __init__(self, store: Store, access: Access, wake: Callable[..., None]):
        self.store = store
        self.access = access
        self.wake = wake

    def cancel(self, caller: str, req: api.CancelTask) -> CancelAnswer:
        task, acknowledged = self._request(caller, req)
        if task is None:
            raise not_found()
        if acknowledged:
            self.wake(scheduler=False)  # the reconciler stops the job
            if task.state == TaskState.CANCELLED:  # a queued task ends here, not in Attempts
                metrics.COMPLETIONS.labels(task.tool_name, task.state).inc()
        if acknowledged:
            return CancelAnswer(task_id=task.task_id, state=task.state, acknowledged=True)
        return CancelAnswer(task_id=task.task_id, state=task.state, acknowledged=False,
                            message=f"the task is already {task.state}; nothing to cancel")

    def _request(self, caller: str, req: api.CancelTask) -> tuple[TaskRow | None, bool]:
        """The cancel as the store records it: a caller with rights over others' tasks cancels
        what `Access.cancel_target` allows, an administrator's with who asked in the audit and
        in the reason the owner reads. With `cascade`, the tasks waiting for it are cancelled
        with it, their error naming it."""
        def cascade(reason: str) -> dict[str, object] | None:
            return dependencies.cascade_cancelled(req.task_id, reason) if req.cascade else None

        if type(caller) is str:
            return self.store.tasks.request_cancel(req.task_id, caller, req.reason, cancelled_error(req.reason),
                                                   cascade=cascade(req.reason))
        found = self.access.cancel_target(caller, req.task_id)
        if found is None:
            return None, False
        if found.owner == caller:
            return self.store.tasks.request_cancel(req.task_id, caller, req.reason, cancelled_error(req.reason),
                                                   cascade=cascade(req.reason))
        reason = f"by an administrator: {req.reason}"  # what the owner reads in the task's error
        return self.store.tasks.request_cancel(req.task_id, found.owner, reason, cancelled_error(reason),
                                               admin=str(caller), cascade=cascade(reason))
