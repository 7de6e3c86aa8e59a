"""Retention: finished tasks expire after their ttl (their logs, artifacts, result and inputs go;
the row stays as a tombstone that answers "expired"), and tombstones, their finished job rows and
old audit events are purged after periods of their own (`Settings.purge_after_s`,
`Settings.audit_retention_s`)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane import states
from controlplane.states import TaskState
from controlplane.store import queries as q
from controlplane.store.writer import Writer


@dataclass(frozen=True)
class Expiring:
    task_id: str
    state: TaskState
    store_url: str
    provider: str


@dataclass(frozen=True)
class Purged:
    tasks: int
    events: int


class RetentionStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    def due_for_expiry(self, now: float, limit: int = 500) -> list[Expiring]:
        with self.db.read() as c:  # an IN list: through SQLAlchemy, not the prebuilt path
            rows = c.execute(q.DUE_FOR_EXPIRY, {"now": now, "lim": limit}).mappings().all()
        return [Expiring(r["task_id"], TaskState(r["state"]), r["store_url"], r["provider"]) for r in rows]

    def expire(self, task_id: str) -> bool:
        """terminal -> expired: logs and artifact rows go, the task row stays as a tombstone."""
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, task_id)
            if task is None or task.state not in states.TERMINAL:
                return False
            self.db.run(c, q.DELETE_TASK_LOGS, {"task_id": task_id})
            self.db.run(c, q.DELETE_TASK_ARTIFACTS, {"task_id": task_id})
            self.w.transition(c, task, TaskState.EXPIRED, kind="expired",
                              values={"inputs_json": "{}", "result_json": None, "progress_json": None}, now=now)
            return True

    def purge(self, now: float, *, purge_after_s: float, audit_retention_s: float, limit: int = 500) -> Purged:
        """Delete the tombstones of tasks that expired more than `purge_after_s` ago (with their
        tags and ended job rows), and audit events older than `audit_retention_s`."""
        with self.w.tx() as c:
            due = self.db.run(c, q.DUE_FOR_PURGE, {"before": now - purge_after_s, "lim": limit})
            for r in due:
                self.db.run(c, q.DELETE_TASK_TAGS, {"pk": r["pk"]})
                c.execute(q.DELETE_TASK_JOBS, {"task_id": r["task_id"]})
                self.db.run(c, q.DELETE_TASK, {"pk": r["pk"]})
            events = self.db.run(c, q.DELETE_OLD_EVENTS, {"before": now - audit_retention_s})
        return Purged(len(due), int(events))
