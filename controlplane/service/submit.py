"""submit_task, and a catalog tool called by name: the checks, the write (alone or in a group
commit), the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane import api, blocking
from controlplane.admission import Admission
from controlplane.api import iso
from controlplane.budgets import budget_exceeded
from controlplane.errors import ControlPlaneError, ErrorCode, invalid
from controlplane.estimates import Estimator
from controlplane.group_commit import GroupCommit
from controlplane.guards import BudgetReached, LimitReached, QueueFull
from controlplane.limits import limit_exceeded
from controlplane.ops import metrics
from controlplane.prices import Pricing, money
from controlplane.service.answers import DirectAnswer, Money, SubmitAnswer
from controlplane.service.polling import poll_after_ms
from controlplane.states import TaskState
from controlplane.store import NewTask, Store, Submitted
from controlplane.store.tasks import Guards, Submit
from controlplane_providers.base import Provider

# Submits made while others are being served wait up to this long for more to join their group
# commit on SQLite, whose commit then runs on the event loop (`GroupCommit.gather_s`), or until every
# call in progress has joined (the value was chosen by measurement: docs/design/hot-path.md).
GROUP_GATHER_S = 0.004

WriteAlone = Callable[[NewTask, Guards], Submitted | None]


def queue_full(e: QueueFull) -> ControlPlaneError:
    return ControlPlaneError(ErrorCode.QUEUE_OVERLOADED, f"queue '{e.queue}' is full ({e.length} tasks waiting)",
                             hint="retry later, or lower the rate of submissions")


class Submits:
    def __init__(self, store: Store, admission: Admission, pricing: Pricing, estimator: Estimator,
                 providers: dict[str, Provider[Any]], wake: Callable[..., None]):
        self.store = store
        self.admission = admission
        self.pricing = pricing
        self.estimator = estimator
        self.providers = providers
        self.wake = wake
        # Submits from the event loop are written together (one transaction, one fsync).
        self.load = blocking.Load()  # calls in progress on the loop (the MCP tools count them)
        self.commits: GroupCommit[Submit, Submitted] = GroupCommit(
            store.tasks.submit_many, write_many_on_loop=store.tasks.submit_many_on_loop,
            gather_s=GROUP_GATHER_S if store.db.is_sqlite else 0.0, in_progress=lambda: self.load.calls)
        self.load.on_answered = self.commits.poke

    def submit(self, caller: str, req: api.SubmitTask) -> SubmitAnswer:
        new, guards = self.admission.check(caller, req)
        try:
            sub = self.store.tasks.submit(new, guards)
        except QueueFull as e:
            raise queue_full(e) from None
        except LimitReached as e:
            raise self.refused(e) from None
        return self.submitted(new, sub)

    async def grouped(self, caller: str, req: api.SubmitTask, alone: WriteAlone) -> SubmitAnswer:
        """`submit` for callers on the event loop. A submit alone is written at once, on the loop
        by `alone` (a short SQLite transaction costs less than a hop to a thread and back); one
        made while other calls are being served (`blocking.Load`) or a group commit is forming or
        in flight, or that finds the write lock taken, joins one (`controlplane.group_commit`:
        one transaction and one fsync for all, off the loop). Either way it is answered once its
        task is on disk."""
        new, guards = await blocking.call(self.admission.check, caller, req)
        try:
            sub = alone(new, guards) if not (self.commits.busy or self.load.others) else None
            if sub is None:
                sub = await self.commits.run((new, guards))
        except QueueFull as e:
            raise queue_full(e) from None
        except LimitReached as e:
            raise self.refused(e) from None
        return await blocking.call(self.submitted, new, sub)

    def alone(self, new: NewTask, guards: Guards) -> Submitted | None:
        """The write on the loop, or None when it would wait (the lock taken, or an engine that
        is reached over the network)."""
        try:
            with blocking.inline():
                return self.store.tasks.submit(new, guards)
        except blocking.WouldBlock:
            return None

    def refused(self, e: LimitReached) -> ControlPlaneError:
        """A submit refused by a limit of its caller, or by a budget."""
        return budget_exceeded(e, self.pricing.currency) if isinstance(e, BudgetReached) else limit_exceeded(e)

    def submitted(self, new: NewTask, sub: Submitted) -> SubmitAnswer:
        """The answer to a submit once its task is written (or found by its idempotency key)."""
        task, created = sub.task, sub.created
        if created:
            self.wake(reconciler=False, queued_in=task.resource_class)  # a new task needs a slot, not a reconcile
            metrics.SUBMITS.labels(task.tool_name).inc()
        elif task.inputs_json != new.inputs_json and task.state != TaskState.EXPIRED:
            raise invalid(f"idempotency_key '{new.idempotency_key}' was already used for task {task.task_id} "
                          "with different inputs", hint="use a new key for a different request")
        position = sub.position
        if not created and task.state == TaskState.QUEUED:
            position = self.store.tasks.queue_position(task)
        extra: dict[str, Any] = {} if created else {"deduplicated": True}
        return SubmitAnswer(
            task_id=task.task_id, state=task.state, queue=task.resource_class, position=position,
            submitted_at=iso(task.submitted_at), poll_after_ms=poll_after_ms(task, self.estimator, self.providers),
            estimated_runtime_seconds=task.estimate_s,
            estimated_cost=Money(amount=money(task.estimate_cost), currency=self.pricing.currency), **extra)

    @staticmethod
    def direct(tool_name: str, sub: SubmitAnswer) -> DirectAnswer:
        """A catalog tool's answer (the two-stage answer): submit_task's, plus a `message` saying
        how to follow the task."""
        est = sub.estimated_runtime_seconds
        return DirectAnswer(**{name: getattr(sub, name) for name in sub.model_fields_set},
                            message=f"{tool_name} queued as task {sub.task_id} (estimated runtime {est:.0f} s). "
                                    "Follow it with get_task_status, tail_task_logs and get_task_result.")
