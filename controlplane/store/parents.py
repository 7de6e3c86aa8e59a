"""Parents (`after`): the `task_parents` rows of a task that waits for others, and the reads a
parent's end and a child's status need, each inside the caller's transaction or read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.states import TaskState
from controlplane.store import queries as q
from controlplane.store.db import Database

ParentStates = dict[str, TaskState | None]  # parent id -> its state (None: purged)


def add(db: Database, c: Any, child_id: str, parents: Sequence[str]) -> None:
    """The child waits for each of `parents` (one statement)."""
    if parents:
        c.execute(q.INSERT_PARENT, [{"child_id": child_id, "parent_id": p} for p in dict.fromkeys(parents)])


def of(db: Database, c: Any, child_id: str) -> ParentStates:
    """The child's parents and their states as this transaction sees them."""
    return {r["parent_id"]: TaskState(r["state"]) if r["state"] is not None else None
            for r in db.rows(c, q.PARENTS_OF, {"child_id": child_id})}


def waiting_children(db: Database, c: Any, parent_id: str, after: str, limit: int) -> list[str]:
    """The ids of the parent's children still waiting with ids above `after`, in order, at most
    `limit`."""
    return [r["task_id"] for r in db.rows(c, q.WAITING_CHILDREN, {"parent_id": parent_id, "after": after,
                                                                  "lim": limit})]


def read(db: Database, child_id: str) -> ParentStates:
    """`of`, in a read of its own (a status)."""
    return {r["parent_id"]: TaskState(r["state"]) if r["state"] is not None else None
            for r in db.fetch(q.PARENTS_OF, {"child_id": child_id})}
