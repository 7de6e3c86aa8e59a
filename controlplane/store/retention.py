"""Retention: finished tasks expire after their ttl (their logs, artifacts, result and inputs go;
the row stays as a tombstone that answers "expired"), and tombstones, their finished job rows and
old audit events are purged after periods of their own (a sweep's row once none of its shards
is left) (`Settings.purge_after_s`,
`Settings.audit_retention_s`).

Every write here is one bounded batch in its own short transaction: a store with a million
tasks on file has backlogs of hundreds of thousands, and one transaction over all of them would
hold SQLite's write lock (every submit waits behind it) and the whole batch in memory. How many
batches a reconciler cycle runs is `controlplane.retention`'s decision, not the store's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane import states
from controlplane.states import TaskState
from controlplane.store import queries as q
from controlplane.store import sweep_queries as sq
from controlplane.store.writer import Writer


@dataclass(frozen=True)
class Expiring:
    pk: int
    task_id: str
    state: TaskState
    store_url: str
    expires_at: float
    log_first_seq: int  # the task's stored log lines are log_first_seq..log_seq
    log_seq: int

    @property
    def log_lines(self) -> int:
        return max(0, self.log_seq - self.log_first_seq + 1)


@dataclass(frozen=True)
class Purged:
    tasks: int
    events: int
    sweeps: int = 0


class RetentionStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    def due_for_expiry(self, now: float, state: TaskState, after: tuple[float, int] = (float("-inf"), 0),
                       limit: int = 200) -> list[Expiring]:
        """Tasks in `state` (terminal) past their ttl, oldest expiry first, after the cursor
        `after` = (expires_at, pk) of the last one seen."""
        rows = self.db.fetch(q.DUE_FOR_EXPIRY, {"state": state.value, "now": now, "after_ts": after[0],
                                                "after_pk": after[1], "lim": limit})
        return [Expiring(r["pk"], r["task_id"], TaskState(r["state"]), r["store_url"], r["expires_at"],
                         r["log_first_seq"], r["log_seq"]) for r in rows]

    def drop_logs(self, task_id: str, below_seq: int) -> int:
        """Delete a task's log lines below `below_seq` (a slice of a long log, before it expires)."""
        with self.w.tx() as c:
            return self.db.count(c, q.DELETE_TASK_LOGS_BELOW, {"task_id": task_id, "below": below_seq})

    def expire(self, task_ids: Sequence[str]) -> list[str]:
        """terminal -> expired, in one transaction: logs and artifact rows go, each task row stays
        as a tombstone. Returns the ids expired (a task no longer terminal is left alone)."""
        now = self.w.clock()
        done = []
        with self.w.tx() as c:
            for task_id in task_ids:
                task = self.w.lock_task(c, task_id)
                if task is None or task.state not in states.TERMINAL:
                    continue
                self.db.run(c, q.DELETE_TASK_LOGS, {"task_id": task_id})
                self.db.run(c, q.DELETE_TASK_ARTIFACTS, {"task_id": task_id})
                self.w.transition(c, task, TaskState.EXPIRED, kind="expired",
                                  values={"inputs_json": "{}", "result_json": None, "progress_json": None}, now=now)
                done.append(task_id)
        return done

    def purge_tombstones(self, before: float, limit: int) -> int:
        """Delete up to `limit` tombstones of tasks that expired before `before`, with their tags,
        ended job rows, parent links and input references, in one transaction. Returns how many."""
        with self.w.tx() as c:
            due = self.db.rows(c, q.DUE_FOR_PURGE, {"before": before, "lim": limit})
            if due:
                c.execute(q.DELETE_TASK_TAGS, [{"pk": r["pk"]} for r in due])
                c.execute(q.DELETE_TASK_JOBS, [{"task_id": r["task_id"]} for r in due])
                c.execute(q.DELETE_TASK_PARENTS, [{"task_id": r["task_id"]} for r in due])
                c.execute(q.DELETE_TASK_INPUTS, [{"task_id": r["task_id"]} for r in due])
                c.execute(q.DELETE_TASK, [{"pk": r["pk"]} for r in due])
        return len(due)

    def purge_sweeps(self, before: float, limit: int) -> int:
        """Delete up to `limit` sweeps made before `before` none of whose shards is left (each
        purged as a tombstone), in one transaction. Returns how many."""
        with self.w.tx() as c:
            due = self.db.rows(c, sq.DUE_SWEEPS, {"before": before, "lim": limit})
            if due:
                c.execute(sq.DELETE_SWEEP, [{"pk": r["pk"]} for r in due])
        return len(due)

    def purge_events(self, before: float, limit: int) -> int:
        """Delete up to `limit` audit events older than `before`, in one transaction."""
        with self.w.tx() as c:
            return self.db.count(c, q.DELETE_OLD_EVENTS, {"before": before, "lim": limit})

    def purge(self, now: float, *, purge_after_s: float, audit_retention_s: float, limit: int = 500) -> Purged:
        """Everything due for purging (operators, tests), `limit` rows per transaction."""
        tasks = events = swept = 0
        while (n := self.purge_tombstones(now - purge_after_s, limit)) > 0:
            tasks += n
        while (n := self.purge_sweeps(now - purge_after_s, limit)) > 0:
            swept += n
        while (n := self.purge_events(now - audit_retention_s, limit)) > 0:
            events += n
        return Purged(tasks, events, swept)
