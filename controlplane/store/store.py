"""The task store: every read and write of task metadata, as named, transactional operations.

Owns: the SQL (portable SQLAlchemy Core over the sqlmodel tables), the enforcement of the state
machine (`controlplane.states`) on every write, and the rule that each transition writes its
task_event in the same transaction. It never touches providers, object stores or the network.

Rows are returned as plain dicts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from controlplane import ids, states
from controlplane.outcomes import Decision
from controlplane.states import TaskState
from controlplane.store.db import Database
from controlplane.store.models import Artifact, Job, Lease, Task, TaskEvent, TaskLog, TaskTag

T = Task.__table__
TAGS = TaskTag.__table__
EV = TaskEvent.__table__
LOGS = TaskLog.__table__
ART = Artifact.__table__
JOBS = Job.__table__
LEASES = Lease.__table__

S = TaskState
_SLOT = [s.value for s in states.SLOT_HOLDING]
_TERMINAL = [s.value for s in states.TERMINAL]

# Columns list_tasks returns (not the potentially large inputs/results).
LIST_COLUMNS = [
    T.c.pk, T.c.task_id, T.c.tool_name, T.c.state, T.c.priority, T.c.resource_class, T.c.attempt,
    T.c.submitted_at, T.c.started_at, T.c.updated_at, T.c.completed_at, T.c.tags_json, T.c.progress_json,
]


# Hot-path statements, built once: SQLAlchemy then only binds parameters (building a statement
# per call costs more than the query itself on SQLite).
_bp = bindparam
GET_TASK = select(T).where(T.c.task_id == _bp("task_id"))
GET_OWNED_TASK = select(T).where(T.c.task_id == _bp("task_id"), T.c.owner == _bp("owner"))
GET_IDEMPOTENT = select(T).where(T.c.owner == _bp("owner"), T.c.tool_name == _bp("tool_name"),
                                 T.c.idempotency_key == _bp("key"))
# Admission into a queue: its length, and how many waiting tasks a new one would queue behind.
QUEUE_ADMISSION = (select(func.count().label("waiting"),
                          func.sum(case((T.c.priority >= _bp("prio"), 1), else_=0)).label("ahead"))
                   .select_from(T).where(T.c.resource_class == _bp("rc"), T.c.state == S.QUEUED.value))
# Tasks ahead of one in its queue: one index range (the queued tasks of the class at or above its
# priority), counting those of higher priority and those of its own priority submitted earlier.
QUEUE_POSITION = (select(func.count().label("ahead")).select_from(T)
                  .where(T.c.resource_class == _bp("rc"), T.c.state == S.QUEUED.value,
                         T.c.priority >= _bp("prio"),
                         or_(T.c.priority > _bp("prio"), T.c.pk < _bp("pk"))))
GET_JOB = select(JOBS).where(JOBS.c.task_id == _bp("task_id"), JOBS.c.attempt == _bp("attempt"))
RECENT_RUNS = (select(T.c.input_size, T.c.started_at, T.c.completed_at)
               .where(T.c.tool_name == _bp("tool"), T.c.state == S.SUCCEEDED.value, T.c.started_at.is_not(None))
               .order_by(T.c.pk.desc()).limit(_bp("lim")))
UPDATE_TASK_VERSIONED = update(T).where(T.c.pk == _bp("_pk"), T.c.version == _bp("_version"))
INSERT_TASK = insert(T).returning(T.c.pk)
INSERT_TAGS = insert(TAGS)
INSERT_EVENT = insert(EV)
_LOG_COLS = (LOGS.c.seq, LOGS.c.ts, LOGS.c.stream, LOGS.c.level, LOGS.c.message, LOGS.c.attempt)
TAIL_LOGS = (select(*_LOG_COLS).where(LOGS.c.task_id == _bp("task_id"), LOGS.c.seq > _bp("after"))
             .order_by(LOGS.c.seq).limit(_bp("lim")))
LAST_LOGS = (select(*_LOG_COLS).where(LOGS.c.task_id == _bp("task_id"))
             .order_by(LOGS.c.seq.desc()).limit(_bp("lim")))


class QueueFull(Exception):
    def __init__(self, queue: str, length: int):
        super().__init__(f"queue {queue} is full ({length} tasks waiting)")
        self.queue = queue
        self.length = length


class StaleAttempt(Exception):
    """A runner reported for an attempt that is no longer the task's current one."""


@dataclass
class NewTask:
    owner: str
    tool_name: str
    inputs_json: str
    input_size: float | None
    provider: str
    resource_class: str
    priority: int
    ttl_s: int
    idempotency_key: str | None
    tags: list[str]
    resources_json: str
    max_runtime_s: int
    max_attempts: int
    estimate_s: float | None
    store_url: str = ""  # '' = the default store


@dataclass
class IngestResult:
    ack_seq: int
    cancel: bool
    gap_from: int | None = None  # events from here on are missing: read them from the store
    finished: bool = False
    store_url: str = ""  # the task's object store (where missing events are)


def _now() -> float:
    return time.time()


class Store:
    def __init__(self, db: Database, clock: Callable[[], float] = _now):
        self.db = db
        self.clock = clock
        self._lock_stmt = db.for_update(GET_TASK)
        # Called with a task id after each committed change to the task (state or progress);
        # the progress hub uses it to push updates to connected clients.
        self.on_change: Callable[[str], None] | None = None
        self._local = threading.local()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """A write transaction; after it commits, `on_change` hears of every task it changed."""
        changed: list[str] = []
        outer = getattr(self._local, "changed", None)
        self._local.changed = changed
        try:
            with self.db.write() as c:
                yield c
        finally:
            self._local.changed = outer
        if self.on_change is not None:
            for task_id in dict.fromkeys(changed):
                self.on_change(task_id)

    def _changed(self, task_id: str) -> None:
        changed = getattr(self._local, "changed", None)
        if changed is not None:
            changed.append(task_id)

    # ==== transitions (the only code that changes tasks.state) ==============================
    def _transition(
        self,
        c: Connection,
        task: dict[str, Any],
        to: TaskState,
        *,
        kind: str | None = None,
        detail: dict[str, Any] | None = None,
        values: dict[str, Any] | None = None,
        now: float,
    ) -> dict[str, Any]:
        states.check(task["task_id"], task["state"], to)
        vals = dict(values or {})
        vals.update(state=to.value, updated_at=now, version=task["version"] + 1)
        if to in states.TERMINAL:
            vals.setdefault("completed_at", now)
            vals.setdefault("expires_at", now + task["ttl_s"])
        changed = self.db.run(c, UPDATE_TASK_VERSIONED, {"_pk": task["pk"], "_version": task["version"], **vals})
        if changed != 1:  # pragma: no cover - write transactions are serialised
            raise RuntimeError(f"task {task['task_id']} changed under a write transaction")
        self._event(c, task["task_id"], kind or to.value, task["state"], to.value,
                    vals.get("attempt", task["attempt"]), detail, now)
        self._changed(task["task_id"])
        task = {**task, **vals}
        return task

    def _event(self, c: Connection, task_id: str, kind: str, frm: str | None, to: str | None, attempt: int,
               detail: dict[str, Any] | None, now: float) -> None:
        self.db.run(c, INSERT_EVENT, {"task_id": task_id, "ts": now, "kind": kind, "from_state": frm, "to_state": to,
                                      "attempt": attempt, "detail_json": json.dumps(detail) if detail else None})

    def _lock_task(self, c: Connection, task_id: str) -> dict[str, Any] | None:
        rows = self.db.run(c, self._lock_stmt, {"task_id": task_id})
        return rows[0] if rows else None

    def transition(self, task_id: str, to: TaskState, *, only_from: Iterable[TaskState] | None = None,
                   kind: str | None = None, detail: dict[str, Any] | None = None,
                   values: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Move one task to `to`. Returns the new row, or None if `only_from` no longer holds.
        Raises states.IllegalTransition for a transition the state machine forbids."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None:
                raise KeyError(task_id)
            if only_from is not None and task["state"] not in {s.value for s in only_from}:
                return None
            return self._transition(c, task, to, kind=kind, detail=detail, values=values, now=now)

    # ==== submit ==============================================================================
    def submit(self, new: NewTask, *, queue_limit: int) -> tuple[dict[str, Any], bool]:
        """Insert a queued task, or return the existing one for a repeated idempotency key.
        Raises QueueFull when the resource class already has `queue_limit` tasks waiting."""
        for _ in range(3):
            try:
                return self._submit(new, queue_limit)
            except IntegrityError:
                # Lost an idempotency race on an engine that does not serialise writers; the
                # winner's row is committed now.
                existing = self.find_idempotent(new.owner, new.tool_name, new.idempotency_key)
                if existing is not None:
                    return existing, False
        raise RuntimeError("could not submit the task")  # pragma: no cover

    def _submit(self, new: NewTask, queue_limit: int) -> tuple[dict[str, Any], bool]:
        now = self.clock()
        with self._tx() as c:
            if new.idempotency_key is not None:
                rows = self.db.run(c, GET_IDEMPOTENT, {"owner": new.owner, "tool_name": new.tool_name,
                                                       "key": new.idempotency_key})
                if rows:
                    return rows[0], False
            self.db.lock_queue(c, new.resource_class)
            [adm] = self.db.run(c, QUEUE_ADMISSION, {"rc": new.resource_class, "prio": new.priority})
            waiting, ahead = adm["waiting"], adm["ahead"] or 0
            if waiting >= queue_limit:
                raise QueueFull(new.resource_class, waiting)
            values = dict(
                task_id=ids.new_task_id(), owner=new.owner, tool_name=new.tool_name, inputs_json=new.inputs_json,
                input_size=new.input_size, provider=new.provider, resource_class=new.resource_class,
                priority=new.priority, ttl_s=new.ttl_s, idempotency_key=new.idempotency_key,
                tags_json=json.dumps(new.tags), resources_json=new.resources_json, max_runtime_s=new.max_runtime_s,
                state=S.QUEUED.value, attempt=1, max_attempts=new.max_attempts, not_before=0.0,
                submitted_at=now, updated_at=now, cancel_requested=False, estimate_s=new.estimate_s,
                log_seq=0, log_first_seq=1, version=1, store_url=new.store_url,
            )
            pk = self.db.run(c, INSERT_TASK, values)[0]["pk"]
            if new.tags:
                c.execute(INSERT_TAGS, [{"task_pk": pk, "tag": t, "owner": new.owner, "submitted_at": now}
                                        for t in dict.fromkeys(new.tags)])
            self._event(c, values["task_id"], "submitted", None, S.QUEUED.value, 1,
                        {"priority": new.priority, "queue": new.resource_class}, now)
            return {**values, "pk": pk, "position": ahead + 1}, True

    def find_idempotent(self, owner: str, tool_name: str, key: str | None) -> dict[str, Any] | None:
        if key is None:
            return None
        with self.db.read() as c:
            row = c.execute(GET_IDEMPOTENT, {"owner": owner, "tool_name": tool_name, "key": key}).mappings().first()
            return dict(row) if row else None

    # ==== reads ===============================================================================
    def get(self, task_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """The task, or None when unknown or (with `owner`) someone else's."""
        if owner is None:
            rows = self.db.fetch(GET_TASK, {"task_id": task_id})
        else:
            rows = self.db.fetch(GET_OWNED_TASK, {"task_id": task_id, "owner": owner})
        return rows[0] if rows else None

    def queue_position(self, task: dict[str, Any]) -> int:
        """1-based position among the queued tasks of its class (priority first, then FIFO)."""
        [row] = self.db.fetch(QUEUE_POSITION, {"rc": task["resource_class"], "prio": task["priority"],
                                               "pk": task["pk"]})
        return int(row["ahead"] or 0) + 1

    def list(self, owner: str, *, states_: Sequence[str] | None = None, tool_name: str | None = None,
             tags_any: Sequence[str] | None = None, submitted_after: float | None = None,
             submitted_before: float | None = None, after: tuple[float, int] | None = None,
             limit: int = 50) -> list[dict[str, Any]]:
        """Newest first by submission time; `after` = (submitted_at, pk) of the last row of the
        previous page (keyset pagination: a page costs the same wherever it starts).

        Each query walks one index in order and stops after `limit` rows. A filter with several
        values (tags, states) runs one such walk per value and merges them, so that it never
        sorts everything that matches."""
        if tags_any:
            drivers: list[tuple[Any, Any]] = [(TAGS, TAGS.c.tag == t) for t in dict.fromkeys(tags_any)]
        elif states_ and len(states_) > 1:
            drivers = [(T, T.c.state == st) for st in dict.fromkeys(states_)]
        else:
            drivers = [(T, None)]
        rows: dict[int, dict[str, Any]] = {}
        with self.db.read() as c:
            for table, cond in drivers:
                if table is TAGS:  # the tag index carries owner and submission time
                    ts, pk = TAGS.c.submitted_at, TAGS.c.task_pk
                    q = select(*LIST_COLUMNS).select_from(TAGS.join(T, T.c.pk == TAGS.c.task_pk)).where(
                        TAGS.c.owner == owner, cond)
                    if states_:
                        q = q.where(T.c.state.in_(list(states_)))
                else:
                    ts, pk = T.c.submitted_at, T.c.pk
                    q = select(*LIST_COLUMNS).where(T.c.owner == owner)
                    if cond is not None:
                        q = q.where(cond)
                    elif states_:
                        q = q.where(T.c.state == states_[0])
                if tool_name:
                    q = q.where(T.c.tool_name == tool_name)
                if submitted_after is not None:
                    q = q.where(ts >= submitted_after)
                if submitted_before is not None:
                    q = q.where(ts < submitted_before)
                if after is not None:
                    q = q.where(tuple_(ts, pk) < tuple_(after[0], after[1]))
                q = q.order_by(ts.desc(), pk.desc()).limit(limit)
                for r in c.execute(q).mappings():
                    rows.setdefault(r["pk"], dict(r))
        ordered = sorted(rows.values(), key=lambda r: (r["submitted_at"], r["pk"]), reverse=True)
        return ordered[:limit]

    def task_ids(self, owner: str, prefix: str, limit: int) -> list[str]:
        """The owner's task ids that start with `prefix`, newest first (for completion).

        A short prefix matches many tasks: walk the owner's newest tasks and stop after `limit`
        matches. A longer one matches few among all tasks (ids are random): range-scan the id
        index and sort those few."""
        if len(prefix) <= 6:  # "tsk_" and up to two random characters
            q = (select(T.c.task_id).where(T.c.owner == owner, T.c.task_id.startswith(prefix, autoescape=True))
                 .order_by(T.c.submitted_at.desc(), T.c.pk.desc()).limit(limit))
            with self.db.read() as c:
                return [r[0] for r in c.execute(q)]
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        q = select(T.c.task_id, T.c.submitted_at, T.c.owner).where(T.c.task_id >= prefix, T.c.task_id < upper)
        with self.db.read() as c:
            rows = [r for r in c.execute(q.limit(10_000)) if r[2] == owner]
        rows.sort(key=lambda r: r[1], reverse=True)
        return [r[0] for r in rows[:limit]]

    def recent_inputs(self, owner: str, tool_name: str, limit: int) -> list[dict[str, Any]]:
        """The inputs of the owner's most recent tasks of a tool, newest first (for completion)."""
        q = (select(T.c.inputs_json).where(T.c.owner == owner, T.c.tool_name == tool_name)
             .order_by(T.c.submitted_at.desc(), T.c.pk.desc()).limit(limit))
        with self.db.read() as c:
            return [json.loads(r[0]) for r in c.execute(q)]

    def runtimes(self, tool_name: str, limit: int) -> list[tuple[float | None, float]]:
        """(input size, runtime in s) of the tool's most recent successful runs."""
        rows = self.db.fetch(RECENT_RUNS, {"tool": tool_name, "lim": limit})
        return [(r["input_size"], r["completed_at"] - r["started_at"]) for r in rows]

    def events(self, task_id: str) -> list[dict[str, Any]]:
        with self.db.read() as c:
            rows = c.execute(select(EV).where(EV.c.task_id == task_id).order_by(EV.c.pk)).mappings()
            return [dict(r) for r in rows]

    def artifacts(self, task_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        q = select(ART).where(ART.c.task_id == task_id)
        if attempt is not None:
            q = q.where(ART.c.attempt == attempt)
        with self.db.read() as c:
            return [dict(r) for r in c.execute(q.order_by(ART.c.name)).mappings()]

    def count_by_state(self, resource_class: str | None = None) -> dict[str, int]:
        q = select(T.c.state, func.count()).group_by(T.c.state)
        if resource_class:
            q = q.where(T.c.resource_class == resource_class)
        with self.db.read() as c:
            return {s: n for s, n in c.execute(q)}

    # ==== logs ================================================================================
    def tail_logs(self, task_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        return self.db.fetch(TAIL_LOGS, {"task_id": task_id, "after": after_seq, "lim": limit})

    def last_logs(self, task_id: str, limit: int) -> list[dict[str, Any]]:
        return self.db.fetch(LAST_LOGS, {"task_id": task_id, "lim": limit})[::-1]

    # ==== cancellation ========================================================================
    def request_cancel(self, task_id: str, owner: str, reason: str) -> tuple[dict[str, Any] | None, bool]:
        """Returns (task, acknowledged). A queued task is cancelled at once; a scheduled or
        running one goes to cancel_requested for the reconciler to stop its job; a finished
        one is left as it is (acknowledged=False)."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None or task["owner"] != owner:
                return None, False
            st = TaskState(task["state"])
            vals = {"cancel_requested": True, "cancel_reason": reason}
            if st == S.QUEUED:
                from controlplane.outcomes import cancelled_error

                vals["error_json"] = json.dumps(cancelled_error({**task, "cancel_reason": reason}))
                return self._transition(c, task, S.CANCELLED, kind="cancelled", detail={"reason": reason},
                                        values=vals, now=now), True
            if st in (S.SCHEDULED, S.RUNNING):
                vals["stop_reason"] = "cancel"
                return self._transition(c, task, S.CANCEL_REQUESTED, kind="cancel_requested",
                                        detail={"reason": reason}, values=vals, now=now), True
            if st in (S.CANCEL_REQUESTED, S.CANCELLING):
                return task, True
            return task, False

    # ==== scheduling ==========================================================================
    def claim_for_launch(self, resource_class: str, capacity: int, limit: int | None = None) -> list[dict[str, Any]]:
        """Move the next queued tasks of a class into free slots: each gets a job row in state
        `launching` (the launch intent, recorded before any provider call) and becomes
        `scheduled`, in one transaction. Returns the job rows joined with their tasks."""
        now = self.clock()
        with self._tx() as c:
            busy = c.execute(select(func.count()).select_from(T).where(
                T.c.resource_class == resource_class, T.c.state.in_(_SLOT))).scalar_one()
            free = capacity - busy
            if limit is not None:
                free = min(free, limit)
            if free <= 0:
                return []
            rows = c.execute(
                select(T).where(T.c.resource_class == resource_class, T.c.state == S.QUEUED.value,
                                T.c.not_before <= now)
                .order_by(T.c.priority.desc(), T.c.pk).limit(free)
            ).mappings().all()
            claimed = []
            for row in rows:
                task = dict(row)
                worker_id = ids.new_worker_id()
                name = ids.job_name(task["task_id"], task["attempt"])
                job = dict(worker_id=worker_id, task_id=task["task_id"], attempt=task["attempt"],
                           provider=task["provider"], resource_class=resource_class, job_name=name,
                           state="launching", created_at=now, event_seq=0)
                c.execute(insert(JOBS).values(**job))
                task = self._transition(c, task, S.SCHEDULED, kind="scheduled",
                                        detail={"worker_id": worker_id, "job_name": name},
                                        values={"scheduled_at": now, "worker_id": worker_id}, now=now)
                claimed.append({"task": task, "job": job})
            return claimed

    def jobs_to_launch(self) -> list[dict[str, Any]]:
        """Launch intents without a handle yet (new, or left behind by a crash)."""
        with self.db.read() as c:
            q = (select(JOBS, T.c.state.label("task_state"))
                 .join(T, and_(T.c.task_id == JOBS.c.task_id, T.c.attempt == JOBS.c.attempt))
                 .where(JOBS.c.state == "launching"))
            return [dict(r) for r in c.execute(q).mappings()]

    def record_launch(self, worker_id: str, handle: dict[str, Any]) -> bool:
        now = self.clock()
        with self._tx() as c:
            job = c.execute(select(JOBS).where(JOBS.c.worker_id == worker_id)).mappings().first()
            if job is None or job["state"] != "launching":
                return False
            c.execute(update(JOBS).where(JOBS.c.worker_id == worker_id).values(
                state="active", handle_json=json.dumps(handle), launched_at=now))
            self._event(c, job["task_id"], "launched", None, None, job["attempt"],
                        {"worker_id": worker_id, "job_name": job["job_name"]}, now)
            return True

    def active_jobs(self) -> list[dict[str, Any]]:
        """Jobs the reconciler watches, with the fields of their task it needs."""
        with self.db.read() as c:
            q = (select(JOBS.c.worker_id, JOBS.c.task_id, JOBS.c.attempt, JOBS.c.provider, JOBS.c.handle_json,
                        JOBS.c.launched_at, JOBS.c.seen_at, JOBS.c.stop_requested_at, JOBS.c.stop_sent_at,
                        JOBS.c.provider_status, JOBS.c.provider_reason, JOBS.c.event_seq, JOBS.c.job_name,
                        JOBS.c.state.label("job_state"), T.c.attempt.label("task_attempt"),
                        T.c.state, T.c.timeout_at, T.c.tool_name, T.c.heartbeat_at, T.c.stop_reason, T.c.store_url)
                 .join(T, T.c.task_id == JOBS.c.task_id)
                 .where(JOBS.c.state.in_(["active", "draining", "abandoned"])))
            return [dict(r) for r in c.execute(q).mappings()]

    def set_provider_status(self, updates: list[dict[str, Any]]) -> None:
        """Record what the provider said (status word, reason), for many jobs in one statement."""
        if not updates:
            return
        stmt = (update(JOBS).where(JOBS.c.worker_id == bindparam("wid"))
                .values(provider_status=bindparam("st"), provider_reason=bindparam("rs")))
        with self._tx() as c:
            c.execute(stmt, [{"wid": u["worker_id"], "st": u["status"], "rs": u.get("reason")} for u in updates])

    def mark_stop_sent(self, worker_id: str) -> None:
        now = self.clock()
        with self._tx() as c:
            c.execute(update(JOBS).where(JOBS.c.worker_id == worker_id).values(
                stop_sent_at=now, stop_requested_at=func.coalesce(JOBS.c.stop_requested_at, now)))

    def set_job_state(self, worker_id: str, state: str) -> None:
        with self._tx() as c:
            c.execute(update(JOBS).where(JOBS.c.worker_id == worker_id).values(**_job_end(state, self.clock())))

    def jobs(self, states: list[str] | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Jobs for the operator, newest first (all states, or `states`)."""
        with self.db.read() as c:
            q = (select(JOBS.c.worker_id, JOBS.c.task_id, JOBS.c.attempt, JOBS.c.provider, JOBS.c.job_name,
                        JOBS.c.state, JOBS.c.handle_json, JOBS.c.created_at, JOBS.c.finished_at, JOBS.c.abandoned_at,
                        JOBS.c.stop_requested_at, JOBS.c.provider_status, JOBS.c.provider_reason)
                 .order_by(JOBS.c.created_at.desc()).limit(limit))
            if states:
                q = q.where(JOBS.c.state.in_(states))
            return [dict(r) for r in c.execute(q).mappings()]

    def claim_runner_secret(self, task_id: str, attempt: int, nonce_digest: str) -> bool | None:
        """Record the one runner allowed the attempt's secret: True for the first claim and for a
        repeat with the same nonce, False for any other nonce, None if the attempt is not current."""
        with self._tx() as c:
            task = c.execute(select(T.c.attempt, T.c.state).where(T.c.task_id == task_id)).first()
            if task is None or task.attempt != attempt or TaskState(task.state) in states.FINAL:
                return None
            done = c.execute(update(JOBS).where(JOBS.c.task_id == task_id, JOBS.c.attempt == attempt,
                                                or_(JOBS.c.secret_claim.is_(None),
                                                    JOBS.c.secret_claim == nonce_digest))
                             .values(secret_claim=nonce_digest))
            return done.rowcount == 1

    def job(self, task_id: str, attempt: int) -> dict[str, Any] | None:
        rows = self.db.fetch(GET_JOB, {"task_id": task_id, "attempt": attempt})
        return rows[0] if rows else None

    # ==== runner events =======================================================================
    def ingest(self, task_id: str, attempt: int, events: list[dict[str, Any]],
               decide: Callable[[dict[str, Any], dict[str, Any]], Decision],
               artifacts_ok: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
               *, max_line: int = 16384, log_cap: int = 5_000_000) -> IngestResult:
        """Apply a runner's events (logs, progress, start, outcome) in one transaction.

        Idempotent by sequence number: events at or below the job's `event_seq` are skipped.
        A batch that starts past `event_seq + 1` is not applied; `gap_from` tells the caller
        to fetch the missing events (from the object store) first. Raises StaleAttempt when
        the attempt is not the task's current one or the task has already finished.
        """
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            job = c.execute(select(JOBS).where(JOBS.c.task_id == task_id, JOBS.c.attempt == attempt)).mappings().first()
            if task is None or job is None or task["attempt"] != attempt or job["state"] not in ("active", "launching"):
                raise StaleAttempt(task_id)
            if TaskState(task["state"]) in states.FINAL:
                raise StaleAttempt(task_id)
            seq = job["event_seq"]
            by_seq: dict[int, dict[str, Any]] = {}
            for e in events:
                n = int(e.get("seq", 0))
                if n > seq:
                    by_seq.setdefault(n, e)
            fresh = [by_seq[n] for n in sorted(by_seq)]
            if fresh and int(fresh[0]["seq"]) != seq + 1:
                return IngestResult(ack_seq=seq, cancel=task["cancel_requested"], gap_from=seq + 1,
                                    store_url=task["store_url"])
            # contiguous from here on
            contiguous: list[dict[str, Any]] = []
            for e in fresh:
                if int(e["seq"]) != seq + 1:
                    break
                seq += 1
                contiguous.append(e)

            task_vals: dict[str, Any] = {"heartbeat_at": now}
            log_rows = []
            log_seq = task["log_seq"]
            progress = None
            started = False
            outcome = None
            for e in contiguous:
                kind = e.get("type")
                if kind == "log":
                    log_seq += 1
                    msg = str(e.get("message", ""))
                    if len(msg) > max_line:
                        msg = msg[:max_line]
                    log_rows.append({"task_id": task_id, "seq": log_seq, "attempt": attempt,
                                     "ts": float(e.get("ts") or now), "stream": str(e.get("stream", "stdout"))[:8],
                                     "level": str(e.get("level", "info"))[:8], "message": msg})
                elif kind == "progress":
                    progress = {k: e[k] for k in ("percent", "step", "step_total", "phase", "message", "eta_s") if k in e}
                    progress["ts"] = float(e.get("ts") or now)
                elif kind == "started":
                    started = True
                elif kind == "finished":
                    outcome = e
            if log_rows:
                c.execute(insert(LOGS), log_rows)
                task_vals["log_seq"] = log_seq
                if log_seq - task["log_first_seq"] + 1 > log_cap * 1.1:
                    first = log_seq - log_cap + 1
                    c.execute(delete(LOGS).where(LOGS.c.task_id == task_id, LOGS.c.seq < first))
                    task_vals["log_first_seq"] = first
            if progress is not None:
                task_vals["progress_json"] = json.dumps(progress)
                self._changed(task_id)
            c.execute(update(JOBS).where(JOBS.c.worker_id == job["worker_id"]).values(event_seq=seq, seen_at=now))

            if TaskState(task["state"]) == S.SCHEDULED and (started or contiguous or outcome):
                start_ts = now
                task = self._transition(c, task, S.RUNNING, kind="running", detail={"worker_id": job["worker_id"]},
                                        values={"started_at": start_ts, "timeout_at": start_ts + task["max_runtime_s"],
                                                **task_vals}, now=now)
                task_vals = {}
            finished = False
            if outcome is not None:
                arts = artifacts_ok(outcome.get("artifacts") or []) if artifacts_ok else (outcome.get("artifacts") or [])
                self._finish(c, task, job, decide(task, outcome), arts, task_vals, now)
                finished = True
            elif task_vals:
                c.execute(update(T).where(T.c.pk == task["pk"]).values(version=T.c.version + 1, **task_vals))
            return IngestResult(ack_seq=seq, cancel=bool(task["cancel_requested"]), finished=finished,
                                store_url=task["store_url"])

    def touch(self, beats: dict[tuple[str, int], float]) -> None:
        """Record heartbeats (runner calls without events), many at once."""
        if not beats:
            return
        with self._tx() as c:
            for (task_id, attempt), ts in beats.items():
                c.execute(update(JOBS).where(JOBS.c.task_id == task_id, JOBS.c.attempt == attempt,
                                             JOBS.c.state == "active").values(seen_at=ts))
                c.execute(update(T).where(T.c.task_id == task_id, T.c.attempt == attempt)
                          .values(heartbeat_at=ts, version=T.c.version + 1))

    def mark_running(self, task_id: str, attempt: int, started_at: float | None) -> None:
        """The provider says the job runs although the runner has not reported yet."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None or task["attempt"] != attempt or task["state"] != S.SCHEDULED.value:
                return
            start = max(started_at or now, task["scheduled_at"] or 0.0)
            self._transition(c, task, S.RUNNING, kind="running", detail={"source": "provider"},
                             values={"started_at": start, "timeout_at": start + task["max_runtime_s"]}, now=now)

    def finish_attempt(self, task_id: str, attempt: int, decision: Decision,
                       artifacts: list[dict[str, Any]] | None = None,
                       ran: bool = True, job_state: str = "done") -> dict[str, Any] | None:
        """End an attempt from outside the event stream: the provider found the job finished or
        gone, or refused to launch it (`ran=False`)."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            job = c.execute(select(JOBS).where(JOBS.c.task_id == task_id, JOBS.c.attempt == attempt)).mappings().first()
            if task is None or job is None or task["attempt"] != attempt or TaskState(task["state"]) in states.FINAL:
                if job is not None and job["state"] in ("active", "launching"):
                    c.execute(update(JOBS).where(JOBS.c.worker_id == job["worker_id"]).values(**_job_end("done", now)))
                return None
            if ran and task["state"] == S.SCHEDULED.value and not decision.is_retry:  # it ran, unseen
                task = self._transition(c, task, S.RUNNING, kind="running", detail={"source": "outcome"},
                                        values={"started_at": now, "timeout_at": now + task["max_runtime_s"]}, now=now)
            return self._finish(c, task, job, decision, artifacts or [], {}, now, job_state)

    def _finish(self, c: Connection, task: dict[str, Any], job: Any, decision: Decision,
                artifacts: list[dict[str, Any]], extra: dict[str, Any], now: float,
                job_state: str = "done") -> dict[str, Any]:
        c.execute(update(JOBS).where(JOBS.c.worker_id == job["worker_id"]).values(**_job_end(job_state, now)))
        if artifacts:
            c.execute(self.db.insert_ignore(ART), [
                {"artifact_id": ids.new_artifact_id(), "task_id": task["task_id"], "attempt": task["attempt"],
                 "name": a["name"], "kind": a.get("kind") or "file", "size_bytes": int(a["size_bytes"]),
                 "sha256": a["sha256"], "content_type": a.get("content_type") or "application/octet-stream",
                 "store_url": task["store_url"], "storage_key": a["key"], "created_at": now}
                for a in artifacts])
        vals = dict(extra)
        detail: dict[str, Any] = {"worker_id": job["worker_id"]}
        if job_state == "abandoned":
            detail["job"] = "abandoned"  # the task ends without the job's confirmation that it stopped
        if decision.note:
            detail["note"] = decision.note
        if decision.error:
            vals["error_json"] = json.dumps(decision.error)
            detail["error"] = decision.error.get("code")
        if decision.is_retry:
            vals.update(attempt=task["attempt"] + 1, worker_id=None, started_at=None, timeout_at=None,
                        scheduled_at=None, heartbeat_at=None, progress_json=None, stop_reason=None,
                        not_before=now + decision.backoff_s)
            return self._transition(c, task, S.QUEUED, kind="retry", detail=detail, values=vals, now=now)
        if decision.result is not None:
            vals["result_json"] = json.dumps(decision.result)
        return self._transition(c, task, decision.state, detail=detail, values=vals, now=now)

    # ==== reconciler helpers ==================================================================
    def begin_stop(self, task_id: str, reason: str) -> dict[str, Any] | None:
        """cancel_requested -> cancelling (reason "cancel"), or running -> cancelling (reason
        "timeout"): the job is being stopped; the task ends once the job is confirmed gone."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None:
                return None
            st = TaskState(task["state"])
            if reason == "timeout" and st == S.RUNNING:
                return self._transition(c, task, S.CANCELLING, kind="timeout", detail={"timeout_s": task["max_runtime_s"]},
                                        values={"stop_reason": "timeout"}, now=now)
            if st == S.CANCEL_REQUESTED:
                return self._transition(c, task, S.CANCELLING, kind="cancelling", values={}, now=now)
            return None

    def cancel_unlaunched(self, task_id: str, attempt: int) -> None:
        """A cancel arrived before the job was launched (or the launch found nothing): the task
        is cancelled and the launch intent is dropped, in one transaction."""
        from controlplane.outcomes import cancelled_error

        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None or task["attempt"] != attempt or task["state"] not in (S.CANCEL_REQUESTED.value, S.CANCELLING.value):
                return
            c.execute(update(JOBS).where(JOBS.c.task_id == task_id, JOBS.c.attempt == attempt)
                      .values(**_job_end("dropped", now)))
            if task["state"] == S.CANCEL_REQUESTED.value:
                task = self._transition(c, task, S.CANCELLING, kind="cancelling", now=now)
            self._transition(c, task, S.CANCELLED, kind="cancelled", detail={"note": "stopped before launch"},
                             values={"error_json": json.dumps(cancelled_error(task))}, now=now)

    def due_for_expiry(self, now: float, limit: int = 500) -> list[dict[str, Any]]:
        with self.db.read() as c:
            q = (select(T.c.task_id, T.c.state, T.c.store_url)
                 .where(T.c.state.in_(_TERMINAL), T.c.expires_at <= now).limit(limit))
            return [dict(r) for r in c.execute(q).mappings()]

    def expire(self, task_id: str) -> bool:
        """terminal -> expired: logs and artifact rows go, the task row stays as a tombstone."""
        now = self.clock()
        with self._tx() as c:
            task = self._lock_task(c, task_id)
            if task is None or TaskState(task["state"]) not in states.TERMINAL:
                return False
            c.execute(delete(LOGS).where(LOGS.c.task_id == task_id))
            c.execute(delete(ART).where(ART.c.task_id == task_id))
            self._transition(c, task, S.EXPIRED, kind="expired",
                             values={"inputs_json": "{}", "result_json": None, "progress_json": None}, now=now)
            return True

    # ==== leader lease ========================================================================
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        now = self.clock()
        with self._tx() as c:
            stmt = self.db.upsert(LEASES, {"name": name, "holder": holder, "expires_at": now + ttl_s}, ["name"],
                                  where=or_(LEASES.c.holder == holder, LEASES.c.expires_at < now))
            c.execute(stmt)
            row = c.execute(select(LEASES.c.holder).where(LEASES.c.name == name)).first()
            return row is not None and row[0] == holder

    def release_lease(self, name: str, holder: str) -> None:
        with self._tx() as c:
            c.execute(delete(LEASES).where(LEASES.c.name == name, LEASES.c.holder == holder))


def _job_end(state: str, now: float) -> dict[str, Any]:
    """The values a job row takes when it leaves the watched states (or is abandoned: then also
    when the control plane stopped waiting for it)."""
    values: dict[str, Any] = {"state": state, "finished_at": now}
    if state == "abandoned":
        values["abandoned_at"] = now
    return values
