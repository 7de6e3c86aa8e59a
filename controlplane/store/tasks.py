"""Tasks: submission (with idempotency, once the guards it is given pass), reads, pages, cancel
requests and the stops the reconciler begins. Owns the `tasks` and `task_tags` rows; every state
change goes through `Writer.transition`. Knows no policy: limits, errors and reasons come from the
caller.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from controlplane import dependencies, ids, states
from controlplane.states import TaskState
from controlplane.store import folded, inputs, parents
from controlplane.store import queries as q
from controlplane.store.conflicts import rerun_on_conflict
from controlplane.store.counts import Counts, Guard, Refused
from controlplane.store.inputs import InputRow
from controlplane.store.rows import TaskRow, TaskSummary
from controlplane.store.writer import Writer, event_row

S = TaskState


def could_be_task_id(text: str) -> bool:
    """Task ids are printable ASCII (`ids.new_task_id`): other text names no task and is never
    looked up (PostgreSQL could not even be asked about text holding NUL)."""
    return text.isascii() and text.isprintable()


class _Unguarded(Exception):
    """A database error in a batch written without savepoints: run it again with them."""


@dataclass(frozen=True)
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
    max_recoveries: int | None = None  # None: max_attempts - 1
    team: str | None = None  # the team whose members may read it
    estimate_cost: float | None = None  # what it should cost (`controlplane.prices`; None: unpriced)
    after: tuple[str, ...] = ()  # the tasks it waits for (ids the caller may read), sorted, distinct
    refs: tuple[InputRow, ...] = ()  # the files its inputs refer to, resolved (`controlplane.references`)
    # How many tasks the guards count this submit as: 1, or a sweep's shards (written at once,
    # `store.sweeps`), whose `estimate_cost` is then theirs summed.
    count: int = 1


@dataclass(frozen=True)
class Submitted:
    task: TaskRow
    created: bool  # False: an earlier task with the same idempotency key
    position: int | None  # in its queue, for a new task that is queued


Guards = Sequence[Guard[NewTask]]  # a submit's checks, in the order they run (`controlplane.guards`)
Submit = tuple[NewTask, Guards]


class TaskStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    # ---- submit -------------------------------------------------------------------------------
    def submit(self, new: NewTask, guards: Guards = ()) -> Submitted:
        """Insert a queued task once its guards pass, or return the existing one for a repeated
        idempotency key. Raises the first guard's `Refused`, having written nothing."""
        [out] = self.submit_many([(new, guards)])
        if isinstance(out, Exception):
            raise out
        return out

    @rerun_on_conflict
    def submit_many(self, items: Sequence[Submit]) -> list[Submitted | Exception]:
        """Submit several tasks in one transaction (one commit, one fsync: group commit), so that
        one task refused (by a guard, or a lost idempotency race) leaves the others in. Returns,
        in order, each task's Submitted or its exception. Nothing is answered before the commit:
        every Submitted is on disk when this returns. A transaction PostgreSQL aborts for a
        conflict (`store.conflicts`) wrote nothing, and the whole batch is run again."""
        try:
            with self.w.tx() as c:
                return self._submit_all(c, items, guarded=not self.db.is_sqlite)
        except _Unguarded:
            with self.w.tx() as c:
                return self._submit_all(c, items, guarded=True)

    async def submit_many_on_loop(self, items: Sequence[Submit]) -> list[Submitted | Exception]:
        """`submit_many` with its statements on the event loop (`Writer.tx_on_loop`); raises
        WouldBlock, having written nothing, when that cannot be had."""
        try:
            return await self.w.tx_on_loop(lambda c: self._submit_all(c, items, guarded=not self.db.is_sqlite))
        except _Unguarded:
            return await self.w.tx_on_loop(lambda c: self._submit_all(c, items, guarded=True))

    def _submit_all(self, c: Any, items: Sequence[Submit], *, guarded: bool) -> list[Submitted | Exception]:
        """Each item in a savepoint of its own when `guarded`. Unguarded (SQLite): an item refused
        by a guard has written nothing, since its guards run before its first write, and a
        database error, which would need the savepoint, raises `_Unguarded` to have the whole
        batch run again guarded. SQLite serialises writers, so no idempotency race can end in an
        IntegrityError there."""
        counts = Counts(self.db, c, self.w.clock())
        out: list[Submitted | Exception] = []
        # The parents the batch names, share-locked before anything else (docs/design/dependencies.md).
        counts.lock_parents(sorted({p for new, _ in items for p in new.after}))
        # Every guard's locks, the whole batch's at once, held to the commit (`Database.lock`).
        self.db.lock(c, *(key for new, guards in items for g in guards for key in g.locks(new)))
        events: list[dict[str, Any]] = []
        for new, guards in items:
            if not guarded:
                try:
                    out.append(self._submit(c, new, guards, counts, events))
                except Refused as e:
                    out.append(e)
                except IntegrityError as e:
                    raise _Unguarded() from e
                continue
            self.db.command(c, "SAVEPOINT submit_one")
            res: Submitted | Exception
            try:
                res = self._submit(c, new, guards, counts, events)
            except (Refused, IntegrityError) as e:
                self.db.command(c, "ROLLBACK TO SAVEPOINT submit_one")
                # An IntegrityError is a lost idempotency race on an engine that does not
                # serialise writers: the winner's row is committed now, and it is the answer.
                won = self._idempotent(c, new) if isinstance(e, IntegrityError) else None
                res = Submitted(won, False, None) if won is not None else e
            self.db.command(c, "RELEASE SAVEPOINT submit_one")
            out.append(res)
        self.w.events(c, events)  # the batch's "submitted" events in one executemany
        return out

    def _idempotent(self, c: Any, new: NewTask) -> TaskRow | None:
        if new.idempotency_key is None:
            return None
        rows = self.db.rows(c, q.GET_IDEMPOTENT, {"owner": new.owner, "tool_name": new.tool_name,
                                                 "key": new.idempotency_key})
        return TaskRow.from_row(rows[0]) if rows else None

    def _submit(self, c: Any, new: NewTask, guards: Guards, counts: Counts, events: list[dict[str, Any]]) -> Submitted:
        """One task of a batch: its guards, in order, before its first write. A task rolled back
        to its savepoint was never counted as waiting: it is counted once written."""
        existing = self._idempotent(c, new)
        if existing is not None:
            return Submitted(existing, False, None)
        for guard in guards:
            guard.check(counts, new)
        now = counts.now
        found = counts.parents(new.after)
        state = dependencies.verdict(found) if new.after else S.QUEUED
        # Its parents ended while it was admitted: an artifact it refers to must be there now, and
        # fit its scratch disk with the rest, as at a release.
        late = self.w.inputs_error(inputs.lookup(self.db, c, new.refs), new.tool_name,
                                   new.resources_json, new.resource_class) \
            if state == S.QUEUED and any(not r.resolved for r in new.refs) else None
        if late is not None:
            state = S.FAILED
        ahead = sum(n for prio, n in counts.waiting(new.resource_class).items() if prio >= new.priority)
        recoveries = new.max_recoveries if new.max_recoveries is not None else new.max_attempts - 1
        values = dict(
            task_id=ids.new_task_id(), owner=new.owner, tool_name=new.tool_name, inputs_json=new.inputs_json,
            input_size=new.input_size, provider=new.provider, resource_class=new.resource_class,
            priority=new.priority, ttl_s=new.ttl_s, idempotency_key=new.idempotency_key,
            tags_json=json.dumps(new.tags), resources_json=new.resources_json, max_runtime_s=new.max_runtime_s,
            state=state.value, attempt=1, max_attempts=new.max_attempts, not_before=0.0,
            submitted_at=now, updated_at=now, cancel_requested=False, estimate_s=new.estimate_s,
            log_seq=0, log_first_seq=1, version=1, store_url=new.store_url, failures=0, recoveries=0,
            max_recoveries=recoveries, team=new.team, estimate_cost=new.estimate_cost,
        )
        detail: dict[str, Any] = {"priority": new.priority, "queue": new.resource_class}
        if new.after:
            detail["after"] = list(new.after)
        if state == S.FAILED:  # a parent had already ended badly: admitted, and ended at once
            error = late or dependencies.dependency_failed(found)
            values.update(error_json=json.dumps(error), completed_at=now, expires_at=now + new.ttl_s)
            detail.update(error=error)
        pk = self.db.rows(c, q.INSERT_TASK, values)[0]["pk"]
        if new.tags:
            c.execute(q.INSERT_TAGS, [{"task_pk": pk, "tag": t, "owner": new.owner, "submitted_at": now}
                                      for t in dict.fromkeys(new.tags)])
        parents.add(self.db, c, str(values["task_id"]), new.after)
        inputs.add(c, str(values["task_id"]), new.refs)
        if state == S.QUEUED and new.refs:
            inputs.resolve_artifacts(self.db, c, str(values["task_id"]))
        if state == S.QUEUED:
            counts.queued(new.resource_class, new.priority)  # as the trigger counted it
        events.append(event_row(str(values["task_id"]), "submitted", None, state.value, 1, detail, now))
        return Submitted(TaskRow.from_row({**values, "pk": pk}), True, ahead + 1 if state == S.QUEUED else None)

    def find_idempotent(self, owner: str, tool_name: str, key: str | None) -> TaskRow | None:
        if key is None:
            return None
        rows = self.db.fetch(q.GET_IDEMPOTENT, {"owner": owner, "tool_name": tool_name, "key": key})
        return TaskRow.from_row(rows[0]) if rows else None

    # ---- reads --------------------------------------------------------------------------------
    def get(self, task_id: str, owner: str | None = None) -> TaskRow | None:
        """The task, or None when unknown or (with `owner`) someone else's."""
        if not could_be_task_id(task_id):
            return None
        if owner is None:
            rows = self.db.fetch(q.GET_TASK, {"task_id": task_id})
        else:
            rows = self.db.fetch(q.GET_OWNED_TASK, {"task_id": task_id, "owner": owner})
        return TaskRow.from_row(rows[0]) if rows else None

    def queue_position(self, task: TaskRow) -> int:
        """1-based position among the queued tasks of its class (priority first, then FIFO)."""
        [row] = self.db.fetch(q.QUEUE_POSITION, {"rc": task.resource_class, "prio": task.priority, "pk": task.pk})
        return int(row["ahead"] or 0) + 1

    def list(self, owner: str, *, teams: Sequence[str] | None = None, states_: Sequence[str] | None = None,
             tool_name: str | None = None,
             tags_any: Sequence[str] | None = None, submitted_after: float | None = None,
             submitted_before: float | None = None, after: tuple[float, int] | None = None,
             limit: int = 50, parent: str | None = None, sweep: str | None = None,
             whole_sweeps: bool = False) -> builtins.list[TaskSummary]:
        """Newest first by submission time; `after` = (submitted_at, pk) of the last row of the
        previous page (keyset pagination: a page costs the same wherever it starts). `teams`:
        only the tasks shared with one of these teams; `parent`: only the tasks waiting (or that
        waited) for it; `sweep`: only that sweep's shards; `whole_sweeps`: of each sweep only
        its lowest shard on file (in `states_`, when given: the row a list of tasks and sweeps
        shows the sweep at: `folded.page`, or for the filters it does not answer a walk that
        passes every other shard)."""
        with self.db.read() as c:
            if whole_sweeps and folded.answers(tags_any, parent, sweep):
                return folded.page(c, owner, teams=teams, states_=states_, tool_name=tool_name,
                                   submitted_after=submitted_after, submitted_before=submitted_before,
                                   after=after, limit=limit)
            return folded.newest(c, q.list_page(owner, teams=teams, states_=states_, tool_name=tool_name,
                                                tags_any=tags_any, submitted_after=submitted_after,
                                                submitted_before=submitted_before, after=after, limit=limit,
                                                parent=parent, sweep=sweep, whole_sweeps=whole_sweeps), limit)

    def list_everyone(self, *, states_: Sequence[str] | None = None, tool_name: str | None = None,
                      tags_any: Sequence[str] | None = None, submitted_after: float | None = None,
                      submitted_before: float | None = None, after_pk: int | None = None,
                      limit: int = 50, parent: str | None = None, sweep: str | None = None,
                      whole_sweeps: bool = False) -> builtins.list[tuple[TaskSummary, str]]:
        """Every owner's tasks, newest first by submission order (`pk`; `after_pk`: the last row of
        the previous page), each with its owner: an administrator's list (`whole_sweeps` as in `list`)."""
        with self.db.read() as c:
            result = c.execute(q.everyone_page(states_=states_, tool_name=tool_name, tags_any=tags_any,
                                               submitted_after=submitted_after, submitted_before=submitted_before,
                                               after_pk=after_pk, limit=limit, parent=parent, sweep=sweep,
                                               whole_sweeps=whole_sweeps))
            rows = result.all()
        n = len(q.LIST_FIELDS)
        return [(TaskSummary(*r[:n]), r[n]) for r in rows]

    def audit_reads(self, reads: Sequence[tuple[str, str, int]], kind: str, detail: dict[str, Any]) -> None:
        """One audit entry per (task id, state, attempt) as the reader saw them, in one transaction
        and one statement (an administrator's page of list_tasks); changes nothing else."""
        now = self.w.clock()
        with self.w.tx() as c:
            self.w.events(c, [event_row(tid, kind, state, state, attempt, detail, now) for tid, state, attempt in reads])

    def task_ids(self, owner: str, prefix: str, limit: int) -> builtins.list[str]:
        """The owner's task ids that start with `prefix`, newest first (for completion)."""
        if not could_be_task_id(prefix):
            return []
        stmt, filtered = q.task_ids_by_prefix(owner, prefix, limit)
        with self.db.read() as c:
            rows = list(c.execute(stmt))
        if filtered:
            rows = sorted((r for r in rows if r[2] == owner), key=lambda r: r[1], reverse=True)
        return [r[0] for r in rows[:limit]]

    def recent_inputs(self, owner: str, tool_name: str, limit: int) -> builtins.list[dict[str, Any]]:
        """The inputs of the owner's most recent tasks of a tool, newest first (for completion)."""
        rows = self.db.fetch(q.RECENT_INPUTS, {"owner": owner, "tool": tool_name, "lim": limit})
        return [json.loads(r["inputs_json"]) for r in rows]

    def runtimes(self, tool_name: str, limit: int) -> builtins.list[tuple[float | None, float]]:
        """(input size, runtime in s) of the tool's most recent successful runs."""
        rows = self.db.fetch(q.RECENT_RUNS, {"tool": tool_name, "lim": limit})
        return [(r["input_size"], r["completed_at"] - r["started_at"]) for r in rows]

    def count_by_state(self, resource_class: str | None = None) -> dict[str, int]:
        with self.db.read() as c:
            found: Any = c.execute(q.count_by_state(resource_class))
            return {str(s): int(n) for s, n in found}

    def count_by_tool_and_state(self) -> dict[tuple[str, str], int]:
        """{(state, tool): tasks on file}."""
        with self.db.read() as c:
            found: Any = c.execute(q.COUNT_BY_TOOL_STATE)
            return {(str(state), str(tool)): int(n) for tool, state, n in found}

    def queue_depths(self) -> dict[str, int]:
        """{resource class: tasks waiting in it}, from the depths the triggers keep."""
        with self.db.read() as c:
            found: Any = c.execute(q.QUEUE_DEPTHS)
            return {str(rc): int(n or 0) for rc, n in found}

    def slots_busy(self, resource_class: str) -> int:
        """Tasks holding a slot of the class (scheduled until terminal)."""
        return int(self.db.fetch(q.SLOTS_BUSY, {"rc": resource_class})[0]["busy"])

    # ---- writes -------------------------------------------------------------------------------
    def transition(self, task_id: str, to: TaskState, *, only_from: Iterable[TaskState] | None = None,
                   kind: str | None = None, detail: dict[str, Any] | None = None,
                   values: dict[str, Any] | None = None) -> TaskRow | None:
        """Move one task to `to`. Returns the new row, or None if `only_from` no longer holds.
        Raises states.IllegalTransition for a transition the state machine forbids."""
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, task_id)
            if task is None:
                raise KeyError(task_id)
            if only_from is not None and task.state not in set(only_from):
                return None
            return self.w.transition(c, task, to, kind=kind, detail=detail, values=values, now=now)

    @rerun_on_conflict
    def request_cancel(self, task_id: str, owner: str, reason: str, error: dict[str, Any],
                       admin: str | None = None, cascade: dict[str, Any] | None = None) -> tuple[TaskRow | None, bool]:
        """Returns (task, acknowledged). A queued or waiting task is cancelled at once (with
        `error`); a scheduled or running one goes to cancel_requested for the reconciler to stop
        its job; a finished one is left as it is (acknowledged=False). `admin`: the administrator
        who asked for another owner's task; the audit names them, for a cancel that changed
        nothing too. `cascade`: the error of its waiting descendants, cancelled with it (without
        it they end as its end decides). Its one transaction is run again when PostgreSQL aborts
        it for a conflict (`store.conflicts`)."""
        if not could_be_task_id(task_id):
            return None, False
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, task_id)
            if task is None or task.owner != owner:
                return None, False
            detail: dict[str, Any] = {"reason": reason} if admin is None else {"reason": reason, "by": admin}
            vals: dict[str, Any] = {"cancel_requested": True, "cancel_reason": reason}
            cascading = cascade is not None and task.state not in states.FINAL
            if cascading:  # its waiting descendants: a batch now, the rest recorded for the reconciler
                self.w.releases.settle(c, task.task_id, now, cascade=(task.task_id, cascade or {}))
            if task.state in (S.QUEUED, S.WAITING):
                vals["error_json"] = json.dumps(error)
                move = self.w.transition_alone if cascading else self.w.transition
                return move(c, task, S.CANCELLED, kind="cancelled", detail=detail, values=vals, now=now), True
            if task.state in (S.SCHEDULED, S.RUNNING):
                vals["stop_reason"] = "cancel"
                return self.w.transition(c, task, S.CANCEL_REQUESTED, kind="cancel_requested",
                                         detail=detail, values=vals, now=now), True
            if admin is not None:  # nothing to change, and still an administrator's act
                self.w.event(c, task.task_id, "admin_cancel", task.state.value, task.state.value, task.attempt,
                             detail, now)
            return task, task.state in (S.CANCEL_REQUESTED, S.CANCELLING)

    def settle_left(self) -> int | None:
        """One batch of the waiting children that a parent's end left to settle, in a transaction
        of its own (`Releases.follow_up`): how many were settled, None when none are left."""
        return self.w.releases.follow_up()

    def parents_of(self, task_id: str) -> dict[str, TaskState | None]:
        """The task's parents (`after`) and their states (None: purged)."""
        return parents.read(self.db, task_id)

    def audit(self, task_id: str, kind: str, detail: dict[str, Any]) -> None:
        """An entry in the task's audit that changes nothing else (an administrator's read)."""
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, task_id)
            if task is not None:
                self.w.event(c, task_id, kind, task.state.value, task.state.value, task.attempt, detail, now)

    def begin_stop(self, task_id: str, reason: str) -> TaskRow | None:
        """cancel_requested -> cancelling (reason "cancel"), or running -> cancelling (reason
        "timeout"): the job is being stopped; the task ends once the job is confirmed gone."""
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, task_id)
            if task is None:
                return None
            if reason == "timeout" and task.state == S.RUNNING:
                return self.w.transition(c, task, S.CANCELLING, kind="timeout",
                                         detail={"timeout_s": task.max_runtime_s},
                                         values={"stop_reason": "timeout"}, now=now)
            if task.state == S.CANCEL_REQUESTED:
                return self.w.transition(c, task, S.CANCELLING, kind="cancelling", now=now)
            return None
