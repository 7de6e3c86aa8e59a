"""Usage: what each attempt used (`attempt_usage`, written with the attempt's end by
`AttemptTx.record_usage`), its sums per task and per report, and the operators' budgets
(`budgets`). Persistence only: what usage and cost are is `controlplane.prices`'s, and when a
budget refuses a submit is its guard's (`controlplane.guards.BudgetCheck`, run in the submit's
transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.store import queries as q
from controlplane.store.rows import BudgetRow
from controlplane.store.writer import Writer

SCOPES = ("owner", "tag")


class UsageStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    def of_task(self, task_id: str) -> dict[str, Any]:
        """The sums of a task's recorded attempts: attempts, run_s, vcpu_s, memory_gib_s, gpu_s,
        cost (None when none is priced) and unpriced (attempts without a cost)."""
        row: dict[str, Any] = self.db.fetch(q.TASK_USAGE, {"task_id": task_id})[0]
        return row

    def report(self, group_by: Sequence[str], owner: str | None, since: float, until: float) -> list[dict[str, Any]]:
        with self.db.read() as c:
            return [dict(r._mapping) for r in c.execute(q.usage_report(group_by, owner, since, until))]

    # ---- budgets --------------------------------------------------------------------------------
    def budgets(self) -> list[BudgetRow]:
        with self.db.read() as c:
            return [BudgetRow.from_row(dict(r._mapping)) for r in c.execute(q.BUDGETS_ALL)]

    def set_budget(self, scope: str, subject: str, period: str, amount: float) -> BudgetRow:
        if scope not in SCOPES:
            raise ValueError(f"unknown budget scope {scope!r}")
        row = {"scope": scope, "subject": subject, "period": period, "amount": float(amount),
               "updated_at": self.w.clock()}
        with self.w.tx() as c:
            c.execute(self.db.upsert(q.BUDGETS, row, ["scope", "subject"]))
        return BudgetRow.from_row(row)

    def clear_budget(self, scope: str, subject: str) -> bool:
        with self.w.tx() as c:
            return self.db.run(c, q.DELETE_BUDGET, {"scope": scope, "subject": subject}) == 1
