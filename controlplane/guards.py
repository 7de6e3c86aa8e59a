"""Guards: the checks a submit (or a stream) must pass, made in the transaction that writes it.

Each guard names the locks it needs (`locks`) and decides from what the store counts in that
transaction (`check`, raising a `Refused`). The store takes the union of a batch's locks at once
in one order, then runs each submit's guards in their order (the caller's limits, its budgets,
the queue's length) before that submit's first write: docs/design/guards.md says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controlplane import dependencies
from controlplane.states import TaskState
from controlplane.store import NewTask
from controlplane.store.counts import Counts, Guard, Refused

__all__ = ["BudgetCheck", "BudgetReached", "CallerLimits", "Guard", "LimitReached", "OpenStreams", "QueueFull",
           "QueueLength", "Refused"]


class QueueFull(Refused):
    def __init__(self, queue: str, length: int):
        super().__init__(f"queue {queue} is full ({length} tasks waiting)")
        self.queue = queue
        self.length = length


class LimitReached(Refused):
    """A caller's limit refused a submit or a stream (`controlplane.limits`)."""

    def __init__(self, limit: str, value: float, retry_after_s: float | None):
        super().__init__(f"{limit} limit of {value} reached")
        self.limit = limit
        self.value = value
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class QueueLength:
    """At most `limit` tasks waiting in the task's queue (its resource class), counting every task
    of the submit (a sweep's shards). Lock: the queue's, which the scheduler's claims take too. A
    task that will wait for its parents is in no queue and passes (released, it joins its queue
    even when full: it was admitted already)."""

    limit: int

    def locks(self, new: NewTask) -> Iterable[str]:
        return (new.resource_class,)

    def check(self, counts: Counts, new: NewTask) -> None:
        if new.after and dependencies.verdict(counts.parents(new.after)) != TaskState.QUEUED:
            return
        waiting = sum(counts.waiting(new.resource_class).values())
        if waiting + new.count > self.limit:
            raise QueueFull(new.resource_class, waiting)


@dataclass(frozen=True)
class CallerLimits:
    """A caller's submits per sliding minute and day, and tasks in flight (None: no limit of that
    kind; 0 refuses every submit), a submit of several tasks (a sweep) counting each. Lock: one
    per caller."""

    per_minute: int | None = None
    per_day: int | None = None
    in_flight: int | None = None

    def locks(self, new: NewTask) -> Iterable[str]:
        return (f"caller:{new.owner}",)

    def check(self, counts: Counts, new: NewTask) -> None:
        now = counts.now
        for name, window, limit in (("submits_per_minute", 60.0, self.per_minute),
                                    ("submits_per_day", 86400.0, self.per_day)):
            if limit is None:
                continue
            if limit < new.count:  # (0 refuses every submit): never room for them all
                raise LimitReached(name, limit, None)
            # While the (limit - count + 1)-th newest submit is in the window there is no room for
            # `count` more; they may go once it leaves.
            nth = counts.nth_newest_submit(new.owner, now - window, limit - new.count + 1)
            if nth is not None:
                raise LimitReached(name, limit, max(0.0, nth + window - now))
        limit = self.in_flight
        if limit is not None:
            if limit < new.count:
                raise LimitReached("tasks_in_flight", limit, None)
            rows = counts.in_flight(new.owner, limit)
            if len(rows) + new.count > limit:
                # When one of them may be done: the soonest expected end, from its estimate.
                ends = [(started or now) + (estimate or 10.0) - now for started, estimate in rows]
                raise LimitReached("tasks_in_flight", limit, min(300.0, max(1.0, min(ends))))


@dataclass(frozen=True)
class BudgetCheck:
    """At most `amount` spent in [since, until) by `scope` ("owner" or "tag") `subject`, counting
    what its tasks not yet ended are expected to cost and this submit's estimate (a sweep's: all
    its shards'). Lock: one per budget."""

    scope: str
    subject: str
    period: str
    amount: float
    since: float
    until: float

    def locks(self, new: NewTask) -> Iterable[str]:
        return (f"budget:{self.scope}:{self.subject}",)

    def check(self, counts: Counts, new: NewTask) -> None:
        spent = counts.spent(self.scope, self.subject, self.since)
        running = counts.running(self.scope, self.subject)
        estimate = new.estimate_cost or 0.0
        if spent + running + estimate > self.amount:
            raise BudgetReached(self, spent, running, estimate, counts.now)


class BudgetReached(LimitReached):
    """A budget refused a submit: spent + running + this task's estimate would exceed it."""

    def __init__(self, budget: BudgetCheck, spent: float, running: float, estimate: float, now: float):
        super().__init__("budget", budget.amount, max(1.0, budget.until - now))
        self.budget = budget
        self.spent, self.running, self.estimate = spent, running, estimate


@dataclass(frozen=True)
class OpenStreams:
    """At most `limit` streaming waits of a caller open at once, on any replica. Lock: one per
    caller's streams."""

    limit: int

    def locks(self, caller: str) -> Iterable[str]:
        return (f"streams:{caller}",)

    def check(self, counts: Counts, caller: str) -> None:
        if self.limit <= 0:
            raise LimitReached("streams", self.limit, None)
        expiries = counts.open_streams(caller, self.limit)
        if len(expiries) >= self.limit:
            raise LimitReached("streams", self.limit, max(1.0, min(expiries) - counts.now))
