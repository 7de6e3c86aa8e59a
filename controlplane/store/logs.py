"""A task's log lines and its audit of events (reads; they are written with the attempt and the
transitions that produce them)."""

from __future__ import annotations

from controlplane.store import queries as q
from controlplane.store.db import Database
from controlplane.store.rows import EventRow, LogLine


class LogStore:
    def __init__(self, db: Database):
        self.db = db

    def tail(self, task_id: str, after_seq: int, limit: int) -> list[LogLine]:
        return self.db.fetch(q.TAIL_LOGS, {"task_id": task_id, "after": after_seq, "lim": limit}, into=LogLine.many)

    def last(self, task_id: str, limit: int) -> list[LogLine]:
        return self.db.fetch(q.LAST_LOGS, {"task_id": task_id, "lim": limit}, into=LogLine.many)[::-1]

    def events(self, task_id: str) -> list[EventRow]:
        """Every transition, retry, launch and cancellation of the task, oldest first."""
        return self.db.fetch(q.EVENTS, {"task_id": task_id}, into=EventRow.many)
