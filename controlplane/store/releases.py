"""Releases: the waiting children of a task that ended (or was cancelled with `cascade`), settled
at most `batch` to a transaction. The transaction that ends the parent settles the first batch;
what is left is a `task_releases` row (the parent, the last child settled, a cascade's error)
that the reconciler continues from, a batch a transaction, until none is left
(docs/design/dependencies.md). Which end a child gets is `controlplane.dependencies`' decision.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from controlplane import dependencies
from controlplane.states import TaskState
from controlplane.store import parents
from controlplane.store import queries as q
from controlplane.store.db import Database
from controlplane.store.rows import TaskRow


class Writes(Protocol):
    """What releases need of the store's writer (`controlplane.store.writer.Writer`, which holds
    them: a Protocol, so that this module does not import the module that imports it)."""

    db: Database
    clock: Callable[[], float]

    def tx(self) -> AbstractContextManager[Connection]: ...

    def lock_task(self, c: Connection, task_id: str) -> TaskRow | None: ...

    def unfit_inputs(self, c: Connection, child: TaskRow) -> dict[str, Any] | None: ...

    def transition_alone(self, c: Connection, task: TaskRow, to: TaskState, *, kind: str | None = None,
                         detail: dict[str, Any] | None = None, values: dict[str, Any] | None = None,
                         now: float) -> TaskRow: ...

S = TaskState


@dataclass(frozen=True)
class Pending:
    """A parent whose waiting children with ids above `after` are still to settle; `cascade`:
    (the cancelled ancestor, the error they are cancelled with), else they settle by their
    parents' states."""

    parent_id: str
    after: str = ""
    cascade: tuple[str, dict[str, Any]] | None = None

    @classmethod
    def from_row(cls, r: Any) -> Pending:
        cascade = (r["ancestor"], json.loads(r["cascade_json"])) if r["cascade_json"] else None
        return cls(r["parent_id"], r["after_id"], cascade)

    def row(self, now: float) -> dict[str, Any]:
        ancestor, error = self.cascade if self.cascade else (None, None)
        return {"parent_id": self.parent_id, "after_id": self.after, "ancestor": ancestor,
                "cascade_json": json.dumps(error) if error else None, "created_at": now}


class Releases:
    def __init__(self, writer: Writes, batch: int = 500):
        self.w = writer
        self.db = writer.db
        self.batch = batch  # children one transaction settles at most
        self._of = self.db.for_update(q.RELEASE_OF)
        self._next = self.db.for_update(q.NEXT_RELEASE, skip_locked=True)

    def settle(self, c: Connection, parent: str, now: float, cascade: tuple[str, dict[str, Any]] | None = None) -> int:
        """Settle up to `batch` waiting children of `parent` (from where an earlier transaction
        stopped, if its release row says so), then theirs: each queued once all its parents
        succeeded, ended DEPENDENCY_FAILED once one did not, or with `cascade` (or a cascade
        recorded for `parent`) cancelled with its error. What is left is recorded for
        `follow_up`. Returns the children settled."""
        rows = self.db.rows(c, self._of, {"parent_id": parent})
        first = Pending(parent, "", cascade)
        return self._settle(c, [Pending.from_row(r) for r in rows] or [first], {r["parent_id"] for r in rows}, now)

    def _settle(self, c: Connection, todo: list[Pending], recorded: set[str], now: float) -> int:
        """The worklist `todo` (last first; `recorded`: those with a release row, locked), until
        `batch` children were looked at: the ended ones' children join it (a chain may be
        long). What is left is recorded: a release row updated in place (a transaction waiting
        for its lock reads it then), deleted once done, new ones inserted. Lock order: the
        parent's row (held by the caller), its release rows, each child's row by id, and only
        then the queues the released children join (as a submit takes them: all in one call),
        just before they move into them: a submit naming a child as a parent holds the child's
        row (shared) while it waits for its queue's lock. A child's other parents are read, not
        locked."""
        room, settled, done, continued = self.batch, 0, [], {}
        # {child id: (child, its parents)}: to queue once every one is locked; a child of two
        # parents walked here is met twice, still waiting, and queued once.
        released: dict[str, tuple[TaskRow, list[str]]] = {}
        while todo and room > 0:
            item = todo.pop()
            children = parents.waiting_children(self.db, c, item.parent_id, item.after, room + 1)
            more, children = len(children) > room, children[:room]
            room -= len(children)
            for child_id in children:
                ended = self._one(c, child_id, item, now, released)
                settled += ended is not None
                if ended is not None and ended.state != S.WAITING:
                    todo.append(Pending(child_id, "", item.cascade))
            if more:
                todo.append(Pending(item.parent_id, children[-1], item.cascade))
                continued[item.parent_id] = children[-1]
            elif item.parent_id in recorded:
                done.append({"parent_id": item.parent_id})
        if released:
            self.db.lock(c, *{child.resource_class for child, _ in released.values()})
            for child, waited_for in released.values():
                self.w.transition_alone(c, child, S.QUEUED, kind="released", detail={"after": waited_for}, now=now)
        if done:
            c.execute(q.DELETE_RELEASE, done)
        for parent_id, after in continued.items():
            if parent_id in recorded:
                self.db.run(c, q.UPDATE_RELEASE, {"_parent": parent_id, "after_id": after})
        new = [left.row(now) for left in todo if left.parent_id not in recorded]  # (one not reached: as it was)
        if new:
            c.execute(q.INSERT_RELEASE, new)
        return settled

    def _one(self, c: Connection, child_id: str, item: Pending, now: float,
             released: dict[str, tuple[TaskRow, list[str]]]) -> TaskRow | None:
        """One child of `item`'s parent settled: its new row, the row it has when it is to be
        queued (added to `released`, moved by the caller), or None when it stays as it is (or
        is in `released` already)."""
        if child_id in released:
            return None
        child = self.w.lock_task(c, child_id)
        if child is None or child.state != S.WAITING:
            return None
        if item.cascade is not None:
            ancestor, error = item.cascade
            return self.w.transition_alone(c, child, S.CANCELLED, kind="cancelled", detail={"ancestor": ancestor},
                                           values={"cancel_requested": True, "cancel_reason": error["message"][:500],
                                                   "error_json": json.dumps(error)}, now=now)
        found = parents.of(self.db, c, child_id)
        verdict = dependencies.verdict(found)
        unfit = self.w.unfit_inputs(c, child) if verdict == S.QUEUED else None
        if verdict == S.QUEUED and unfit is None:
            released[child_id] = (child, sorted(found))
            return child
        if verdict == S.FAILED or unfit is not None:
            error = unfit or dependencies.dependency_failed(found)
            return self.w.transition_alone(c, child, S.FAILED, kind="dependency_failed",
                                           detail={"parent": error["parent"], "parent_state": error["parent_state"]},
                                           values={"error_json": json.dumps(error)}, now=now)
        return None

    def follow_up(self) -> int | None:
        """One batch of what is left, oldest first, in a transaction of its own: up to `batch`
        release rows, locked; one another transaction holds is passed over (PostgreSQL: SKIP
        LOCKED). Returns the children settled, or None when no release was left to take."""
        if not self.db.fetch(q.NEXT_RELEASE, {"lim": 1}):  # a read, not a write transaction, when none is left
            return None
        now = self.w.clock()
        with self.w.tx() as c:
            rows = self.db.rows(c, self._next, {"lim": self.batch})
            if not rows:
                return None
            return self._settle(c, [Pending.from_row(r) for r in reversed(rows)], {r["parent_id"] for r in rows}, now)
