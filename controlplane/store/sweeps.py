"""Sweeps: one submit of many tasks of one tool. Owns the `sweeps` rows and writes a sweep's shards
(each an ordinary task with `sweep_id` and `shard`) in the transaction that admits it, all or
nothing: the guards it is given count every shard at once (`NewTask.count`). Reads a sweep's
aggregates and pages, and stops a sweep (cancel_sweep, or its failure policy in the transaction
that ends the shard that trips it: `shard_ended`). Knows no policy: whether a failure stops a
sweep is `controlplane.sweeps.trips`, reasons and errors come from the caller. A stop moves at most
a batch of shards a transaction (the writer's release batch); what is left the reconciler
continues (`stop_left`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from controlplane import dependencies, ids, sweeps
from controlplane.states import TaskState
from controlplane.store import inputs
from controlplane.store import queries as q
from controlplane.store import sweep_queries as sq
from controlplane.store.conflicts import rerun, rerun_on_conflict
from controlplane.store.counts import Counts
from controlplane.store.rows import SweepRow, TaskRow
from controlplane.store.tasks import Guards, NewTask
from controlplane.store.writer import Writer, event_row

S = TaskState


@dataclass(frozen=True)
class NewSweep:
    owner: str
    tool_name: str
    resource_class: str
    base_inputs_json: str
    vary_json: str
    priority: int
    tags: list[str]
    team: str | None = None
    max_parallel: int | None = None
    fail_fast: int | None = None
    idempotency_key: str | None = None
    estimate_s: float | None = None  # the whole sweep's
    estimate_cost: float | None = None  # its shards' summed (None: unpriced)


@dataclass(frozen=True)
class SweptIn:
    sweep: SweepRow
    created: bool  # False: an earlier sweep with the same idempotency key


class SweepStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db
        self.lock_stmt = self.db.for_update(sq.GET_SWEEP)
        # A stop in the transaction of a shard's end skips the shards other transactions hold
        # (on PostgreSQL; SQLite serialises writers): see docs/design/sweeps.md.
        self.lock_shard = self.db.for_update(q.GET_TASK, skip_locked=True)

    # ---- submit -------------------------------------------------------------------------------
    @rerun_on_conflict
    def submit(self, new: NewSweep, shards: Sequence[NewTask], guards: Guards) -> SweptIn:
        """Write the sweep and its shards (each a task) in one transaction once `guards` pass for
        all of them at once, or return the sweep a repeated idempotency key made. Raises the
        first guard's `Refused`, having written nothing. Run again whole when PostgreSQL aborts
        the transaction for a conflict (`store.conflicts`)."""
        try:
            with self.w.tx() as c:
                return self._submit(c, new, shards, guards)
        except IntegrityError:  # a lost idempotency race (PostgreSQL): the winner's is the answer
            won = self.find_idempotent(new.owner, new.tool_name, new.idempotency_key)
            if won is None:
                raise
            return SweptIn(won, False)

    def _submit(self, c: Connection, new: NewSweep, shards: Sequence[NewTask], guards: Guards) -> SweptIn:
        now = self.w.clock()
        first = shards[0]
        counts = Counts(self.db, c, now)
        counts.lock_parents(list(first.after))
        existing = self._idempotent(c, new)
        if existing is not None:
            return SweptIn(existing, False)
        whole = replace(first, count=len(shards), estimate_cost=new.estimate_cost)
        self.db.lock(c, *(key for g in guards for key in g.locks(whole)))
        for guard in guards:
            guard.check(counts, whole)
        sweep_id = ids.new_sweep_id()
        values: dict[str, Any] = dict(
            sweep_id=sweep_id, owner=new.owner, team=new.team, tool_name=new.tool_name,
            resource_class=new.resource_class, base_inputs_json=new.base_inputs_json, vary_json=new.vary_json,
            shards=len(shards), max_parallel=new.max_parallel, fail_fast=new.fail_fast, priority=new.priority,
            tags_json=json.dumps(new.tags), idempotency_key=new.idempotency_key, estimate_s=new.estimate_s,
            estimate_cost=new.estimate_cost, created_at=now)
        pk = self.db.rows(c, sq.INSERT_SWEEP, values)[0]["pk"]
        found = counts.parents(first.after)
        state = dependencies.verdict(found) if first.after else S.QUEUED
        rows, events = [], []
        for shard, task in enumerate(shards):
            row = self._shard_row(c, task, sweep_id, shard, state, found, now)
            rows.append(row)
            detail: dict[str, Any] = {"priority": task.priority, "queue": task.resource_class, "sweep": sweep_id,
                                      "shard": shard}
            if task.after:
                detail["after"] = list(task.after)
            events.append(event_row(row["task_id"], "submitted", None, row["state"], 1, detail, now))
        self.db.insert_many(c, sq.INSERT_SHARD, rows)
        keys = self.db.rows(c, sq.SHARD_KEYS, {"sweep_id": sweep_id})
        tags = list(dict.fromkeys(new.tags))
        self.db.insert_many(c, q.INSERT_TAGS, [{"task_pk": k["pk"], "tag": t, "owner": new.owner, "submitted_at": now}
                                            for k in keys for t in tags])
        self.db.insert_many(c, q.INSERT_PARENT, [{"child_id": k["task_id"], "parent_id": p}
                                              for k in keys for p in first.after])
        for k, task, row in zip(keys, shards, rows, strict=True):
            if task.refs:
                inputs.add(c, k["task_id"], task.refs)
                if row["state"] == S.QUEUED.value:
                    inputs.resolve_artifacts(self.db, c, k["task_id"])
        self.db.insert_many(c, q.INSERT_EVENT, events)
        return SweptIn(SweepRow.from_row({**values, "pk": pk}), True)

    def _shard_row(self, c: Connection, task: NewTask, sweep_id: str, shard: int, state: TaskState,
                   found: dict[str, TaskState | None], now: float) -> dict[str, Any]:
        """A shard's tasks row, as `TaskStore._submit` writes a task (every row with the same keys:
        one executemany)."""
        # Its parents ended while it was admitted: an artifact it refers to must be there now, and
        # fit its scratch disk with the rest, as at a release.
        late = self.w.inputs_error(inputs.lookup(self.db, c, task.refs), task.tool_name,
                                   task.resources_json, task.resource_class) \
            if state == S.QUEUED and any(not r.resolved for r in task.refs) else None
        error: dict[str, Any] | None = None
        if late is not None:
            state, error = S.FAILED, late
        elif state == S.FAILED:
            error = dependencies.dependency_failed(found)
        ended = state == S.FAILED
        recoveries = task.max_recoveries if task.max_recoveries is not None else task.max_attempts - 1
        return dict(
            task_id=ids.new_task_id(), owner=task.owner, tool_name=task.tool_name, inputs_json=task.inputs_json,
            input_size=task.input_size, provider=task.provider, resource_class=task.resource_class,
            priority=task.priority, ttl_s=task.ttl_s, idempotency_key=None, tags_json=json.dumps(task.tags),
            resources_json=task.resources_json, max_runtime_s=task.max_runtime_s, state=state.value, attempt=1,
            max_attempts=task.max_attempts, not_before=0.0, submitted_at=now, updated_at=now,
            cancel_requested=False, estimate_s=task.estimate_s, log_seq=0, log_first_seq=1, version=1,
            store_url=task.store_url, failures=0, recoveries=0, max_recoveries=recoveries, team=task.team,
            estimate_cost=task.estimate_cost, sweep_id=sweep_id, shard=shard,
            error_json=json.dumps(error) if error else None, completed_at=now if ended else None,
            expires_at=now + task.ttl_s if ended else None)

    def _idempotent(self, c: Connection, new: NewSweep) -> SweepRow | None:
        if new.idempotency_key is None:
            return None
        rows = self.db.rows(c, sq.GET_IDEMPOTENT_SWEEP, {"owner": new.owner, "tool_name": new.tool_name,
                                                         "key": new.idempotency_key})
        return SweepRow.from_row(rows[0]) if rows else None

    def find_idempotent(self, owner: str, tool_name: str, key: str | None) -> SweepRow | None:
        if key is None:
            return None
        rows = self.db.fetch(sq.GET_IDEMPOTENT_SWEEP, {"owner": owner, "tool_name": tool_name, "key": key})
        return SweepRow.from_row(rows[0]) if rows else None

    # ---- reads --------------------------------------------------------------------------------
    def get(self, sweep_id: str) -> SweepRow | None:
        if not (sweep_id.isascii() and sweep_id.isprintable()):  # (as task ids: other text names none)
            return None
        rows = self.db.fetch(sq.GET_SWEEP, {"sweep_id": sweep_id})
        return SweepRow.from_row(rows[0]) if rows else None

    def state_counts(self, sweep_id: str) -> dict[TaskState, int]:
        """{state: shards in it}: one GROUP BY along the sweep's index."""
        return {S(r["state"]): int(r["n"]) for r in self.db.fetch(sq.STATE_COUNTS, {"sweep_id": sweep_id})}

    def running(self, sweep_id: str) -> list[TaskRow]:
        """The shards running now (at most the slots the sweep holds)."""
        return [TaskRow.from_row(r) for r in self.db.fetch(sq.RUNNING_SHARDS, {"sweep_id": sweep_id})]

    def first_failures(self, sweep_id: str, limit: int) -> list[tuple[int, str, TaskState, dict[str, Any] | None]]:
        """(shard, task id, state, error) of the first shards that failed or timed out, by when."""
        return [(int(r["shard"]), r["task_id"], S(r["state"]), json.loads(r["error_json"]) if r["error_json"] else None)
                for r in self.db.fetch(sq.FIRST_FAILURES, {"sweep_id": sweep_id, "lim": limit})]

    def usage(self, sweep_id: str) -> dict[str, Any]:
        """The sums of the shards' recorded attempts (as `UsageStore.of_task` of one task)."""
        row: dict[str, Any] = self.db.fetch(sq.SWEEP_USAGE, {"sweep_id": sweep_id})[0]
        return row

    def page(self, sweep_id: str, from_shard: int, limit: int) -> list[TaskRow]:
        """Up to `limit` shards from index `from_shard`, in shard order."""
        return [TaskRow.from_row(r) for r in
                self.db.fetch(sq.SHARD_PAGE, {"sweep_id": sweep_id, "from_shard": from_shard, "lim": limit})]

    def audit(self, sweep_id: str, kind: str, detail: dict[str, Any]) -> None:
        """An entry in the sweep's audit (task_events under its id) that changes nothing else (an
        administrator's read)."""
        now = self.w.clock()
        with self.w.tx() as c:
            self.w.event(c, sweep_id, kind, None, None, 0, detail, now)

    # ---- stops --------------------------------------------------------------------------------
    def stop(self, sweep_id: str, reason: str, error: dict[str, Any], batch: int = 500) -> tuple[SweepRow | None, int]:
        """Stop the sweep (its `stopped_at` and `stop_reason`, kept if it had stopped already) and
        cancel every shard not yet ended as cancel_task would (queued or waiting: cancelled;
        scheduled or running: cancel_requested, its job stopped by the reconciler), with `error`,
        `batch` shards per transaction (`_stop_shards`). Returns the sweep and how many shards it
        moved. Each of its transactions is run again when PostgreSQL aborts it for a conflict
        (`store.conflicts`): each is idempotent, and the count stays that of the ones committed."""
        now = self.w.clock()

        def mark() -> list[Any]:
            with self.w.tx() as c:
                self.db.run(c, sq.STOP_SWEEP, {"_sid": sweep_id, "_at": now, "_why": reason[:500]})
                return self.db.rows(c, sq.GET_SWEEP, {"sweep_id": sweep_id})

        def one_batch() -> int:
            with self.w.tx() as c:
                return self._stop_shards(c, sweep_id, reason, error, self.w.clock(), batch, self.w.lock_stmt)

        rows = rerun(mark, "a sweep's stop")
        if not rows:
            return None, 0
        sweep = SweepRow.from_row(rows[0])
        moved = 0
        while True:
            n = rerun(one_batch, "a sweep's stop")
            moved += n
            if n < batch:
                return sweep, moved

    def shard_ended(self, c: Connection, task: TaskRow, now: float) -> None:
        """A shard just ended (`Writer.transition`, in its transaction): when it failed and the
        failures now trip the sweep's `fail_fast`, the sweep stops and its shards not yet ended
        are cancelled, in this transaction. The sweep's row is locked first, so that two shards
        failing at once count each other."""
        if task.state not in sweeps.FAILURES or task.sweep_id is None:
            return
        rows = self.db.rows(c, self.lock_stmt, {"sweep_id": task.sweep_id})
        if not rows:
            return
        sweep = SweepRow.from_row(rows[0])
        if sweep.fail_fast is None or sweep.stopped_at is not None:
            return
        failures = int(self.db.rows(c, sq.FAILURE_COUNT, {"sweep_id": sweep.sweep_id})[0]["n"])
        if not sweeps.trips(sweep.fail_fast, failures):
            return
        reason = sweeps.failed_fast(sweep.sweep_id, sweep.fail_fast)
        self.db.run(c, sq.STOP_SWEEP, {"_sid": sweep.sweep_id, "_at": now, "_why": reason})
        self._stop_shards(c, sweep.sweep_id, reason, sweeps.stopped_error(sweep.sweep_id, reason), now,
                          self.w.releases.batch, self.lock_shard)

    def stop_left(self) -> int | None:
        """One batch of what a stop left (a fail_fast stop moves one batch in the transaction that
        trips it; a stop cut short by a restart): the next stopped sweep's shards not yet ended,
        moved as `stop` moves them, in a transaction of its own that marks the stop done when
        none is left. Returns how many it looked at, or None when every stop is done (one read
        of the sweeps whose stop is not: no write transaction then)."""
        found = self.db.fetch(sq.NEXT_STOP_LEFT, {})
        if not found:
            return None
        sweep_id, why = found[0]["sweep_id"], found[0]["stop_reason"] or "was stopped"
        with self.w.tx() as c:
            return self._stop_shards(c, sweep_id, why, sweeps.stopped_error(sweep_id, why), self.w.clock(),
                                     self.w.releases.batch, self.w.lock_stmt)

    def _stop_shards(self, c: Connection, sweep_id: str, reason: str, error: dict[str, Any], now: float,
                     limit: int | None, lock: Any) -> int:
        """Up to `limit` (None: all) of the sweep's shards not yet ended moved as a cancel moves
        them, each locked by `lock`; when that was all of them, the stop is marked done (unless a
        shard was skipped, or is still held by another transaction). Returns how many were
        looked at. Every shard is locked, in id order, before any moves: a `lock` that waits then
        waits holding no queue's depth row (a queued shard's cancel writes it), and in the order
        a submit naming shards as parents takes their rows (docs/design/guards.md#lock-order)."""
        found = self.db.rows(c, sq.STOPPABLE_SHARDS, {"sweep_id": sweep_id,
                                                          "lim": limit if limit is not None else 2**31 - 1})
        detail = {"reason": reason, "sweep": sweep_id}
        vals: dict[str, Any] = {"cancel_requested": True, "cancel_reason": reason[:500]}
        locked = [rows[0] for r in sorted(found, key=lambda r: r["task_id"])
                  if (rows := self.db.rows(c, lock, {"task_id": r["task_id"]}))]
        for row in locked:
            task = TaskRow.from_row(row)
            if task.state in (S.QUEUED, S.WAITING):
                self.w.transition(c, task, S.CANCELLED, kind="cancelled", detail=detail,
                                  values={**vals, "error_json": json.dumps(error)}, now=now)
            elif task.state in (S.SCHEDULED, S.RUNNING):
                self.w.transition(c, task, S.CANCEL_REQUESTED, kind="cancel_requested", detail=detail,
                                  values={**vals, "stop_reason": "cancel"}, now=now)
        if limit is None or len(found) < limit:
            self.db.run(c, sq.STOP_DONE, {"_sid": sweep_id, "_at": now})
        return len(found)
