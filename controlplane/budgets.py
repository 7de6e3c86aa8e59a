"""Budgets: an operator's cap on what one caller, or all tasks with one tag, may spend per
calendar period (UTC day, week from Monday, or month), in the price table's currency.

A submit is refused when it **would exceed** a budget: what the budget's tasks spent in the
period (the estimated cost of their attempts that ended in it, `attempt_usage`), plus the
estimated cost of its tasks that have not ended yet (`tasks.estimate_cost`, whenever they were
submitted), plus this submit's own estimate, is more than the budget. A task whose cost cannot
be estimated (no price for it) counts as 0 until it has run. The refusal is `LIMIT_EXCEEDED` with
`limit: "budget"` and changes nothing (no task, no idempotency key used).

Budgets live in the database (`controlplane budgets`, the `budgets` table); each replica reads
them at start and again every `CONTROLPLANE_LIMITS_REFRESH_S` (30 s), never on a call, and a submit
that no budget applies to runs no statement more. The check itself is a guard
(`controlplane.guards.BudgetCheck`) run in the submit's own transaction after the idempotency
lookup, under a lock per budget on PostgreSQL, so replicas sharing the database hold a budget
together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from controlplane.errors import ControlPlaneError, ErrorCode
from controlplane.guards import BudgetCheck, BudgetReached
from controlplane.store import Store
from controlplane.store.rows import BudgetRow

PERIODS = ("day", "week", "month")


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The calendar period (UTC) holding `now`, as [start, end) epoch seconds; the period that
    ends after the year 9999 ends at infinity (a datetime cannot hold its end)."""
    t = datetime.fromtimestamp(now, UTC)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, length = day, timedelta(days=1)
    elif period == "week":
        start, length = day - timedelta(days=day.weekday()), timedelta(days=7)
    elif period == "month":
        start, length = day.replace(day=1), timedelta(days=32)
    else:
        raise ValueError(f"unknown period {period!r}; one of {', '.join(PERIODS)}")
    try:
        end = start + length
    except OverflowError:
        return start.timestamp(), math.inf
    return start.timestamp(), (end.replace(day=1) if period == "month" else end).timestamp()


class Budgets:
    def __init__(self, store: Store):
        self.store = store
        self._owners: dict[str, BudgetRow] = {}
        self._tags: dict[str, BudgetRow] = {}

    def refresh(self) -> None:
        """Read the operators' budgets again (a short read; the control plane's loop calls it)."""
        rows = self.store.usage.budgets()
        self._owners = {r.subject: r for r in rows if r.scope == "owner"}
        self._tags = {r.subject: r for r in rows if r.scope == "tag"}

    def for_submit(self, caller: str, tags: Sequence[str], now: float) -> tuple[BudgetCheck, ...]:
        """The guards of the budgets a submit of `caller` with `tags` counts against (none: it
        reads nothing)."""
        if not self._owners and not self._tags:
            return ()
        rows = [self._owners[caller]] if caller in self._owners else []
        # (tags in one order: a refusal names the same budget first whatever order the tags came in)
        rows += [self._tags[t] for t in sorted(set(tags)) if t in self._tags]
        return tuple(BudgetCheck(r.scope, r.subject, r.period, r.amount, *period_bounds(r.period, now)) for r in rows)


def budget_exceeded(e: BudgetReached, currency: str) -> ControlPlaneError:
    """The client's answer: LIMIT_EXCEEDED naming the budget, what it counted, and when its
    period ends (`retry_after_s`)."""
    b = e.budget
    whose = "for this caller" if b.scope == "owner" else f"for tag '{b.subject}'"
    detail = {"scope": b.scope, "period": b.period, "currency": currency, "spent": round(e.spent, 6),
              "running": round(e.running, 6), "estimated_cost": round(e.estimate, 6)}
    if b.scope == "tag":
        detail["tag"] = b.subject
    return ControlPlaneError(
        ErrorCode.LIMIT_EXCEEDED,
        f"budget reached: {b.amount:g} {currency} per {b.period} {whose} (spent {e.spent:.4f}, tasks not yet ended "
        f"{e.running:.4f}, this task about {e.estimate:.4f})",
        hint="wait for the next period (retry_after_s), let or make running tasks end, or ask the operator",
        limit="budget", max=b.amount, retry_after_s=max(1, math.ceil(e.retry_after_s or 1)), budget=detail)
