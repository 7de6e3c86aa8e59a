"""Write transactions and the one function that changes a task's state.

Every aggregate of the store writes through a `Writer`: `tx()` opens a write transaction and,
after it commits, tells `on_change` (the progress hub) of every task it changed (on PostgreSQL,
other processes hear of them through `Database.notify_changed`); `transition` checks the move
against the state machine (`controlplane.states`), bumps the row's version and writes its
task_event in the same transaction, and when the task ends, releases or ends the tasks waiting
for it, transitively, a batch of them in that transaction too (`store.releases`; the reconciler
settles the rest); `move_job` does the same for a job. `guarded(check)` runs `check(conn)` first
in every write transaction its thread opens meanwhile: the leader's lease fence over a whole
reconciler cycle (`Store.fenced`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from controlplane import dependencies, states
from controlplane.ids import AttemptRef
from controlplane.scratch import MIB, overflow
from controlplane.states import JobState, TaskState
from controlplane.store import inputs
from controlplane.store import job_queries as jq
from controlplane.store import queries as q
from controlplane.store.db import Database
from controlplane.store.releases import Releases
from controlplane.store.rows import JobRow, TaskRow

T = TypeVar("T")
V = TypeVar("V")


def _now() -> float:
    return time.time()


def event_row(task_id: str, kind: str, frm: str | None, to: str | None, attempt: int,
              detail: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """A task_events row: what happened to a task, when."""
    return {"task_id": task_id, "ts": now, "kind": kind, "from_state": frm, "to_state": to, "attempt": attempt,
            "detail_json": json.dumps(detail) if detail else None}


class Writer:
    def __init__(self, db: Database, clock: Callable[[], float] = _now, release_batch: int = 500):
        self.db = db
        self.clock = clock
        self.releases = Releases(self, release_batch)  # a task's end settles its waiting children
        self.lock_stmt = db.for_update(q.GET_TASK)
        # Called with a task id after each committed change to the task (state or progress).
        self.on_change: Callable[[str], None] | None = None
        # Called in the transaction that ends a sweep's shard (`SweepStore.shard_ended`).
        self.on_shard_end: Callable[[Connection, TaskRow, float], None] | None = None
        # The scratch_mb cap of a resource class by name (the catalog's; None: no cap), for the
        # files of a task released with artifacts that had no size when it was admitted.
        self.class_scratch_mb: Callable[[str], int | None] = lambda _name: None
        # A tool's max_input_file_mb by name (the catalog's; None: unknown tool), for the same files.
        self.tool_max_input_mb: Callable[[str], int | None] = lambda _name: None
        self._local = threading.local()

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """A write transaction; after it commits, `on_change` hears of every task it changed."""
        with self._collecting() as changed:
            with self.db.write() as c:
                guard = getattr(self._local, "guard", None)
                if guard is not None:
                    guard(c)
                yield c
                # Other replicas hear of the changes through the database, in this transaction
                # (delivered only if it commits); this process's hub below, after the commit.
                self.db.notify_changed(c, list(dict.fromkeys(changed)))
        self._announce(changed)

    async def tx_on_loop(self, fn: Callable[[Connection], T]) -> T:
        """`fn(conn)` in a write transaction run on the event loop, committed in a worker thread
        (`Database.write_on_loop`: raises WouldBlock when it cannot be had at once); after the
        commit, `on_change` hears of every task it changed, as with `tx()`."""
        changed: list[str] = []

        def body(c: Connection) -> T:
            with self._collecting(changed):
                out = fn(c)
                self.db.notify_changed(c, list(dict.fromkeys(changed)))
                return out

        out = await self.db.write_on_loop(body)
        self._announce(changed)
        return out

    def in_tx(self) -> bool:
        """Whether this thread is inside a write transaction of this writer's (`tx`, `tx_on_loop`)."""
        return getattr(self._local, "changed", None) is not None

    @contextmanager
    def guarded(self, check: Callable[[Connection], None]) -> Iterator[None]:
        """While inside, every `tx()` this thread opens runs `check(conn)` first (it raises to
        refuse the transaction). A thread-local scope, not an argument of every write, so that
        a loop's writes (the reconciler's, through tasks, jobs, attempts and retention) are all
        covered, the ones added later too. Not for `tx_on_loop`: the event loop's thread is
        shared by every call."""
        with self._scoped("guard", check):
            yield

    @contextmanager
    def _collecting(self, changed: list[str] | None = None) -> Iterator[list[str]]:
        """While inside, `changed()` collects into the list yielded."""
        with self._scoped("changed", [] if changed is None else changed) as out:
            yield out

    @contextmanager
    def _scoped(self, name: str, value: V) -> Iterator[V]:
        """This thread's `name` is `value` while inside; an outer one is restored on the way out."""
        outer = getattr(self._local, name, None)
        setattr(self._local, name, value)
        try:
            yield value
        finally:
            setattr(self._local, name, outer)

    def _announce(self, changed: list[str]) -> None:
        if self.on_change is not None:
            for task_id in dict.fromkeys(changed):
                self.on_change(task_id)

    def changed(self, task_id: str) -> None:
        changed = getattr(self._local, "changed", None)
        if changed is not None:
            changed.append(task_id)

    def lock_task(self, c: Connection, task_id: str) -> TaskRow | None:
        rows = self.db.rows(c, self.lock_stmt, {"task_id": task_id})
        return TaskRow.from_row(rows[0]) if rows else None

    def job(self, c: Connection, ref: AttemptRef) -> JobRow | None:
        rows = self.db.rows(c, jq.GET_JOB, {"task_id": ref.task_id, "attempt": ref.number})
        return JobRow.from_row(rows[0]) if rows else None

    def event(self, c: Connection, task_id: str, kind: str, frm: str | None, to: str | None, attempt: int,
              detail: dict[str, Any] | None, now: float) -> None:
        self.db.run(c, q.INSERT_EVENT, event_row(task_id, kind, frm, to, attempt, detail, now))

    def launched(self, c: Connection, job: JobRow, now: float) -> None:
        """The audit's one record that the job's launch happened."""
        self.event(c, job.task_id, "launched", None, None, job.attempt,
                   {"job_id": job.job_id, "job_name": job.job_name}, now)

    def events(self, c: Connection, rows: list[dict[str, Any]]) -> None:
        """Several events (`event_row`s) in one statement: a group commit's submits."""
        self.db.run_many(c, q.INSERT_EVENT, rows)

    def transition(self, c: Connection, task: TaskRow, to: TaskState, *, kind: str | None = None,
                   detail: dict[str, Any] | None = None, values: dict[str, Any] | None = None,
                   now: float) -> TaskRow:
        """The only code that changes tasks.state. A task that ends settles the tasks waiting for
        it in the same transaction, at most a batch of them (`Releases.settle`; the rest are
        recorded for the reconciler), and a sweep's shard that ends tells its sweep
        (`on_shard_end`: its failure policy)."""
        moved = self.transition_alone(c, task, to, kind=kind, detail=detail, values=values, now=now)
        if to in states.TERMINAL:
            self.releases.settle(c, moved.task_id, now)
            if moved.sweep_id is not None and self.on_shard_end is not None:
                self.on_shard_end(c, moved, now)
        return moved

    def unfit_inputs(self, c: Connection, child: TaskRow) -> dict[str, Any] | None:
        """A released task's artifacts of parents resolved and recorded (in `c`), and the
        DEPENDENCY_FAILED error that keeps it from running (`inputs_error`), or None."""
        return self.inputs_error(inputs.resolve_artifacts(self.db, c, child.task_id), child.tool_name,
                                 child.resources_json, child.resource_class)

    def inputs_error(self, found: inputs.Resolution, tool_name: str, resources_json: str,
                     resource_class: str) -> dict[str, Any] | None:
        """DEPENDENCY_FAILED when an artifact its inputs refer to is missing, or when one resolved
        late is larger than its tool takes for one file (`max_input_file_mb`), or when with their
        sizes the files no longer fit the task's scratch disk (`scratch.overflow`), as admission
        checked the rest; else None."""
        if found.missing is not None:
            return dependencies.missing_artifact(*found.missing)
        if not found.late:
            return None
        most = self.tool_max_input_mb(tool_name)
        for r in found.rows:
            if most is not None and r.field in found.late and (r.size_bytes or 0) > most * MIB:
                parent, name = inputs.artifact_parts(r.ref) or ("", "")
                return dependencies.inputs_too_big(
                    parent, name, r.size_bytes or 0,
                    f"inputs.{r.field} may be at most {most} MiB (tool '{tool_name}', max_input_file_mb)",
                    "pass a smaller file, or ask the operator for a tool that takes larger ones")
        asked = json.loads(resources_json or "{}").get("scratch_mb")
        too_big = overflow({r.field: r.size_bytes for r in found.rows if r.size_bytes}, asked,
                           self.class_scratch_mb(resource_class), resource_class)
        if too_big is None:
            return None
        biggest = max((r for r in found.rows if r.field in found.late), key=lambda r: r.size_bytes or 0)
        parent, name = inputs.artifact_parts(biggest.ref) or ("", "")
        return dependencies.inputs_too_big(parent, name, biggest.size_bytes or 0, *too_big)

    def transition_alone(self, c: Connection, task: TaskRow, to: TaskState, *, kind: str | None = None,
                         detail: dict[str, Any] | None = None, values: dict[str, Any] | None = None,
                         now: float) -> TaskRow:
        """`transition` without settling the task's children: for `Releases.settle` itself."""
        states.check(task.task_id, task.state, to)
        vals = dict(values or {})
        vals.update(state=to.value, updated_at=now, version=task.version + 1)
        if to in states.TERMINAL:
            vals.setdefault("completed_at", now)
            vals.setdefault("expires_at", now + task.ttl_s)
        changed = self.db.run(c, q.UPDATE_TASK_VERSIONED, {"_pk": task.pk, "_version": task.version, **vals})
        if changed != 1:  # pragma: no cover - write transactions are serialised
            raise RuntimeError(f"task {task.task_id} changed under a write transaction")
        self.event(c, task.task_id, kind or to.value, task.state.value, to.value, vals.get("attempt", task.attempt),
                   detail, now)
        self.changed(task.task_id)
        return task.but(**vals)

    def update_task(self, c: Connection, task: TaskRow, values: dict[str, Any]) -> TaskRow:
        """A write that is not a transition (progress, counters): the version still goes up."""
        self.db.run(c, q.UPDATE_TASK, {"_pk": task.pk, **values})
        return task.but(version=task.version + 1, **values)

    def move_job(self, c: Connection, job: JobRow, to: JobState, now: float, **values: Any) -> JobRow:
        """The only code that changes jobs.state (the transition table of `states.JobState`)."""
        states.check_job(job.job_id, job.state, to)
        vals: dict[str, Any] = {"state": to.value, **values}
        if to != JobState.ACTIVE:  # the attempt ended (for a drained or abandoned job: as far as we care)
            vals["finished_at"] = now
        if to == JobState.ABANDONED:
            vals["abandoned_at"] = now
        self.db.run(c, jq.UPDATE_JOB, {"_jid": job.job_id, **vals})
        return job.but(**vals)
