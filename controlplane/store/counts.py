"""What a guarded write asks of its guards (`Guard`), what they may count in its transaction
(`Counts`), and what they raise to refuse it (`Refused`). The store takes every guard's locks,
runs the guards and writes; what a guard decides is its own (`controlplane.guards`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from controlplane.states import TaskState
from controlplane.store import queries as q

if TYPE_CHECKING:
    from controlplane.store.db import Database

R_contra = TypeVar("R_contra", contravariant=True)


class Refused(Exception):
    """A guard refused a write; nothing of it was written."""


class Guard(Protocol[R_contra]):
    """A check a write must pass, made in the write's own transaction."""

    def locks(self, request: R_contra) -> Iterable[str]:
        """The lock keys (`Database.lock`) the check needs held until the commit."""
        ...

    def check(self, counts: Counts, request: R_contra) -> None:
        """Raise a `Refused` to refuse the write; read only through `counts`."""
        ...


def _scalar(rows: list[dict[str, Any]]) -> float:
    """The one value of a one-row, one-column answer."""
    return float(next(iter(rows[0].values())) or 0.0)


class Counts:
    """Counting reads in one write transaction, whose time is `now`: each sees what was committed
    before it and what the transaction wrote so far. `waiting(queue)` reads a queue's depths once
    per transaction and then counts on with each task written (`queued`), as the trigger does."""

    def __init__(self, db: Database, c: Any, now: float):
        self.db, self.c, self.now = db, c, now
        self._depths: dict[str, dict[int, int]] = {}
        self._parents: dict[str, TaskState | None] = {}
        self._parent_stmt = db.for_share(q.PARENT_STATE)

    def waiting(self, queue: str) -> dict[int, int]:
        """{priority: tasks waiting} in the queue."""
        depths = self._depths.get(queue)
        if depths is None:
            rows = self._rows(q.QUEUE_LEVELS, {"rc": queue})
            depths = self._depths[queue] = {r["priority"]: r["waiting"] for r in rows}
        return depths

    def queued(self, queue: str, priority: int) -> None:
        """One more task waiting in the queue, written by this transaction."""
        depths = self.waiting(queue)
        depths[priority] = depths.get(priority, 0) + 1

    def lock_parents(self, task_ids: list[str]) -> None:
        """Read these tasks' states and keep them from changing until the commit (FOR SHARE on
        PostgreSQL, in the order given; SQLite serialises writers): a parent's end that commits
        meanwhile waits for this transaction, and then finds the children it wrote."""
        for task_id in task_ids:
            if task_id not in self._parents:
                rows = self._rows(self._parent_stmt, {"task_id": task_id})
                self._parents[task_id] = TaskState(rows[0]["state"]) if rows else None

    def parents(self, task_ids: tuple[str, ...]) -> dict[str, TaskState | None]:
        """{parent id: its state (None: no such task)} of a submit's `after`."""
        self.lock_parents(list(task_ids))
        return {task_id: self._parents[task_id] for task_id in task_ids}

    def nth_newest_submit(self, owner: str, since: float, n: int) -> float | None:
        """When the owner's n-th newest task (1-based) submitted after `since` was submitted; None
        when it has fewer. Walks at most n index entries (ix_tasks_owner)."""
        rows = self._rows(q.NTH_NEWEST_SUBMIT, {"owner": owner, "since": since, "off": n - 1})
        return float(rows[0]["submitted_at"]) if rows else None

    def in_flight(self, owner: str, limit: int) -> list[tuple[float | None, float | None]]:
        """(started_at, estimate_s) of at most `limit` of the owner's tasks not yet ended."""
        rows = self._rows(q.IN_FLIGHT, {"owner": owner, "lim": limit})
        return [(r["started_at"], r["estimate_s"]) for r in rows]

    def spent(self, scope: str, subject: str, since: float) -> float:
        """What the attempts of an owner's (scope "owner") or a tag's ("tag") tasks that ended
        since `since` cost."""
        stmt = q.OWNER_SPENT if scope == "owner" else q.TAG_SPENT
        return _scalar(self._rows(stmt, {"subject": subject, "since": since}))

    def running(self, scope: str, subject: str) -> float:
        """The estimated cost of an owner's or a tag's tasks not yet ended."""
        stmt = q.OWNER_RUNNING if scope == "owner" else q.TAG_RUNNING
        return _scalar(self._rows(stmt, {"subject": subject}))

    def open_streams(self, owner: str, limit: int) -> list[float]:
        """When each of at most `limit` of the owner's open streams expires."""
        return [float(r["expires_at"]) for r in self._rows(q.OPEN_STREAMS, {"owner": owner, "lim": limit})]

    def _rows(self, stmt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        rows = self.db.run(self.c, stmt, params)
        assert isinstance(rows, list)  # (a SELECT's rows; only a DML statement answers a count)
        return rows
