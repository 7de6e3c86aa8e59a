"""What a task used and cost (part of its status and result), and usage_report."""

from __future__ import annotations

import time

from controlplane import api
from controlplane.api import iso
from controlplane.budgets import period_bounds
from controlplane.errors import invalid
from controlplane.prices import Pricing, Usage, money, summarize
from controlplane.service.access import Access
from controlplane.service.answers import CostSoFar, UsageFigures, UsageReport
from controlplane.service.answers import Usage as UsageAnswer
from controlplane.service.times import EARLIEST, epoch
from controlplane.states import TaskState
from controlplane.store import Store
from controlplane.store.rows import TaskRow

# The states of a task whose current attempt is running (its usage so far is counted from its start).
_RUNNING = frozenset({TaskState.RUNNING, TaskState.CANCEL_REQUESTED, TaskState.CANCELLING})


class Costs:
    def __init__(self, store: Store, pricing: Pricing):
        self.store = store
        self.pricing = pricing

    def of(self, task: TaskRow) -> UsageAnswer:
        """What the task used (its attempts that ended, and the one running so far) and its
        estimated cost at list price (`controlplane.prices`), with the estimate made at submit.
        A task that has not run yet reads nothing for it; one on its first attempt reads nothing
        either (its usage so far is its run time times its shape)."""
        used, cost, unpriced = Usage(), 0.0, 0
        running = task.started_at is not None and task.state in _RUNNING
        if task.attempt > 1 or (task.started_at is not None and not running):
            # a recorded attempt (a retry's earlier ones, or the one that ended)
            sums = self.store.usage.of_task(task.task_id)
            used = Usage(sums["run_s"], sums["vcpu_s"], sums["memory_gib_s"], sums["gpu_s"])
            cost, unpriced = sums["cost"] or 0.0, sums["unpriced"] or 0  # (NULL sums: no attempt recorded)
        if running:
            # at the placement its job runs on (read only for a tool that has more than one)
            placed_apart = len(self.pricing.catalog.placements(task.tool_name)) > 1
            priced = self.pricing.of_attempt(task, self.store.jobs.get(task.ref)
                                             if placed_apart else None)
            so_far = priced.usage(time.time() - task.started_at)  # type: ignore[operator]
            used = used + so_far
            now_cost = so_far.cost(priced.rate)
            unpriced += now_cost is None
            cost += now_cost or 0.0
        return UsageAnswer(usage=UsageFigures(**used.as_dict()),
                           estimated_cost=CostSoFar(amount=None if unpriced else money(cost),
                                                    currency=self.pricing.currency,
                                                    at_submit=money(task.estimate_cost)))

    def report(self, caller: str, req: api.UsageReport) -> UsageReport:
        """Usage and cost summed per group over [since, until): the caller's own, or (tasks:admin)
        everyone's or one owner's."""
        now = time.time()
        until = epoch(req.until)
        until = now if until is None else until
        since = epoch(req.since)
        if since is None:  # the month `until` falls in (the one before, when it is a month's first instant)
            since = period_bounds("month", max(until - 0.001, EARLIEST))[0]
        elif since >= until:
            raise invalid("since: must be before until")
        if req.everyone:
            Access.everyone(caller, req.owner, "everyone's usage needs the tasks:admin scope",
                            hint="omit everyone to see your own usage")
        owner = None if req.everyone else (req.owner or str(caller))
        # Someone else's usage, without tasks:admin: the answer of a caller who used nothing.
        rows = self.store.usage.report(req.group_by, owner, since, until) if Access.may_see_usage(caller, owner) else []
        return UsageReport(since=iso(since), until=iso(until), owner=owner, group_by=req.group_by,
                           currency=self.pricing.currency, prices_as_of=self.pricing.table.as_of,
                           **summarize(rows, req.group_by))
