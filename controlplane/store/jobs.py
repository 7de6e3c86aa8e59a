"""Jobs: one row per attempt's job at its provider, from the launch intent to its end.

Owns the `jobs` rows: claiming queued tasks into free slots (the launch intent, written before
any provider call), recording the provider's handle, what the reconciler watches and writes
(provider status, stop requests), the runner's one-time secret claim, and the operator's list.
Every state change goes through `Writer.move_job` (the table of `states.JobState`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from sqlalchemy import or_
from sqlalchemy.engine import Connection

from controlplane import ids, states
from controlplane.states import FINAL, JobState, TaskState
from controlplane.store import job_queries as jq
from controlplane.store import queries as q
from controlplane.store.conflicts import rerun_on_conflict
from controlplane.store.db import Database
from controlplane.store.leases import Fence, LeaseStore
from controlplane.store.rows import JobRow, TaskRow, WatchedJob
from controlplane.store.sweep_slots import MAX_PASSES, SweepSlots
from controlplane.store.writer import Writer

# The scheduler's choice of placement for a task, (provider, index in its tool's placements) or
# None (it stays queued), given its earlier attempts' jobs and how many jobs of a tool are not
# ended at one of its placements (each read only if asked for).
Place = Callable[[TaskRow, Callable[[], list[JobRow]], Callable[[str, int], int]], tuple[str, int] | None]

S = TaskState
J = JobState
_TASK_STATES = {s.value: s for s in TaskState}


def _storable(text: Any) -> Any:
    return text.replace("\x00", "\ufffd") if isinstance(text, str) and "\x00" in text else text


def _tuples(_columns: list[str], tuples: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return tuples


class _Placing:
    """What `Place` reads inside one transaction, each only if asked: a task's earlier jobs, and
    the jobs not ended per (tool, placement), counted once and then kept (`placed` adds the claims
    this transaction makes)."""

    def __init__(self, db: Database, c: Connection):
        self.db, self.c = db, c
        self.counted: dict[tuple[str, int], int] = {}

    def busy(self, tool: str, placement: int) -> int:
        if (tool, placement) not in self.counted:
            self.counted[tool, placement] = int(self.c.execute(
                jq.BUSY_AT_PLACEMENT, {"tool": tool, "placement": placement}).scalar_one())
        return self.counted[tool, placement]

    def choose(self, place: Place, task: TaskRow) -> tuple[str, int] | None:
        return place(task, lambda: [JobRow.from_row(j) for j in self.db.rows(
            self.c, jq.JOBS_OF_TASK, {"task_id": task.task_id})], self.busy)

    def placed(self, tool: str, placement: int) -> None:
        if (tool, placement) in self.counted:
            self.counted[tool, placement] += 1


class JobStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db
        self.leases = LeaseStore(writer)  # (its fence checks)
        self.next_queued = self.db.for_update(q.NEXT_QUEUED, skip_locked=True)

    # ---- launching ----------------------------------------------------------------------------
    def claim_for_launch(self, resource_class: str, capacity: int, limit: int | None = None,
                         fence: Fence | None = None, place: Place | None = None,
                         lookahead: int = 0) -> list[tuple[TaskRow, JobRow]]:
        """Move the next queued tasks of a class into free slots: each gets a job row in state
        `launching` (the launch intent, recorded before any provider call) on the placement
        `place` chooses (without it: the task's provider, its first placement) and becomes
        `scheduled`, in one transaction. A task `place` leaves (None) stays queued; up to
        `lookahead` tasks further down the queue are read for the slots it leaves free.

        Where writers are not serialised (PostgreSQL) the claim holds the queue's lock, as a
        submit's admission does, so that slots are counted by one claim at a time and it cannot
        deadlock with a submit on the rows of `queue_depth`; and it locks the tasks it takes,
        skipping any that another transaction (a cancel) holds. With a `fence` (the leader's),
        nothing is claimed unless the lease is still held (raises `leases.Fenced`)."""
        now = self.w.clock()
        with self.w.tx() as c:
            if fence is not None:
                self.leases.check(c, fence)
            self.db.lock(c, resource_class)
            free = capacity - c.execute(q.SLOTS_BUSY, {"rc": resource_class}).scalar_one()
            if limit is not None:
                free = min(free, limit)
            if free <= 0:
                return []
            return self._claim(c, resource_class, free, now, place, lookahead)

    def _claim(self, c: Connection, resource_class: str, free: int, now: float,
               place: Place | None, lookahead: int) -> list[tuple[TaskRow, JobRow]]:
        """Up to `free` queued tasks of the class claimed in order, but no sweep's shard past its
        sweep's `max_parallel` (those stay queued and hold no slot: the tasks behind them are
        claimed instead), no task `place` leaves (it stays queued; up to `lookahead` more are read
        for the slots it leaves), and a stopped sweep's shard cancelled rather than claimed (one a
        stop skipped because another transaction held it)."""
        sweeps = SweepSlots.read(self.db, c, resource_class)
        claimed: list[tuple[TaskRow, JobRow]] = []
        placing = _Placing(self.db, c)
        for _ in range(MAX_PASSES):  # a pass skips the shards of sweeps at their limit, the next leaves them out
            params = {"rc": resource_class, "now": now, "lim": free + lookahead}
            full = sweeps.full()
            if full:  # (an IN list: through SQLAlchemy)
                stmt = self.db.for_update(q.NEXT_QUEUED.where(or_(q.T.c.sweep_id.is_(None),
                                                                  q.T.c.sweep_id.not_in(full))), skip_locked=True)
                rows = [TaskRow.from_row(dict(r)) for r in c.execute(stmt, params).mappings()]
            else:
                rows = [TaskRow.from_row(r) for r in self.db.rows(c, self.next_queued, params)]
            sweeps.learn(self.db, c, {t.sweep_id for t in rows if t.sweep_id is not None})
            skipped = False
            for task in rows:
                if free <= 0:
                    break
                verdict = sweeps.take(task.sweep_id)
                if verdict == "skip":
                    skipped = True
                    continue
                if verdict == "stopped" and task.sweep_id is not None:
                    self.w.transition(c, task, S.CANCELLED, kind="cancelled", detail={"sweep": task.sweep_id},
                                      values=sweeps.cancel_values(task.sweep_id), now=now)
                    continue
                got = self._claim_one(c, task, resource_class, now, place, placing)
                if got is None:  # left queued: it holds none of its sweep's slots
                    sweeps.give_back(task.sweep_id)
                    continue
                claimed.append(got)
                free -= 1
            if not skipped or free <= 0 or not rows:
                return claimed
        return claimed

    def _claim_one(self, c: Connection, task: TaskRow, resource_class: str, now: float, place: Place | None,
                   placing: _Placing) -> tuple[TaskRow, JobRow] | None:
        """The task's launch intent (a job row in `launching`) on the placement `place` chooses and
        its move to `scheduled`; None when `place` leaves it queued."""
        provider, placement = task.provider, 0
        if place is not None:
            chosen = placing.choose(place, task)
            if chosen is None:
                return None
            provider, placement = chosen
            placing.placed(task.tool_name, placement)
        job = JobRow(job_id=ids.new_job_id(), task_id=task.task_id, attempt=task.attempt,
                     provider=provider, resource_class=resource_class,
                     job_name=task.ref.job_name, state=J.LAUNCHING,
                     created_at=now, event_seq=0, placement=placement)
        self.db.run(c, jq.INSERT_JOB, {"job_id": job.job_id, "task_id": job.task_id,
                                      "attempt": job.attempt, "provider": job.provider,
                                      "resource_class": resource_class, "job_name": job.job_name,
                                      "state": job.state.value, "created_at": now, "event_seq": 0,
                                      "placement": placement})
        task = self.w.transition(c, task, S.SCHEDULED, kind="scheduled",
                                 detail={"job_id": job.job_id, "job_name": job.job_name},
                                 values={"scheduled_at": now, "job_id": job.job_id}, now=now)
        return task, job

    def could_claim(self, resource_class: str, capacity: int, place: Place, lookahead: int = 0) -> bool:
        """Whether `claim_for_launch` with `place` may claim a task of the class now, read without
        a write transaction: False only when a slot is free and every queued task ready in the
        claim's window is one `place` leaves (none a sweep's shard, whose limits only the claim
        counts). `place` here must choose nothing (`Placer.peek`)."""
        with self.db.read() as c:
            free = capacity - c.execute(q.SLOTS_BUSY, {"rc": resource_class}).scalar_one()
            if free <= 0:
                return False
            rows = [TaskRow.from_row(r) for r in self.db.rows(
                c, q.NEXT_QUEUED, {"rc": resource_class, "now": self.w.clock(), "lim": free + lookahead})]
            placing = _Placing(self.db, c)
            return any(t.sweep_id is not None or placing.choose(place, t) is not None for t in rows)

    def has_work(self, resource_class: str, capacity: int) -> Literal["full", "idle", "ready"]:
        """"full" (no free slot in the class), "idle" (no queued task ready for one, or only shards
        of sweeps at their `max_parallel`) or "ready": reads, so that a scheduler's tick skips
        `claim_for_launch`'s write transaction when there is nothing to claim."""
        if self.db.fetch(q.SLOTS_BUSY, {"rc": resource_class})[0]["busy"] >= capacity:
            return "full"
        params = {"rc": resource_class, "now": self.w.clock()}
        found = self.db.fetch(q.READY_QUEUED, params)
        if not found:
            return "idle"
        if found[0]["sweep_id"] is None:
            return "ready"
        # A shard: "idle" still when every ready task is a shard of a sweep at its max_parallel,
        # which the claim would skip (SweepSlots' view, as the claim reads it).
        with self.db.read() as c:
            full = SweepSlots.read(self.db, c, resource_class).full()
            if not full:
                return "ready"
            others = q.READY_QUEUED.where(or_(q.T.c.sweep_id.is_(None), q.T.c.sweep_id.not_in(full)))
            return "ready" if c.execute(others, params).first() is not None else "idle"

    def launch_intents(self) -> list[JobRow]:
        """Launch intents without a handle yet (new, or left behind by a crash)."""
        with self.db.read() as c:
            return [JobRow.from_row(r) for r in c.execute(jq.LAUNCH_INTENTS).mappings()]

    def record_launch(self, job_id: str, handle: dict[str, Any], fence: Fence | None = None) -> bool:
        """The job was launched (launching -> active with its handle). With a `fence`, only while
        the lease is still held (raises `leases.Fenced`: the successor finds the job by its name)."""
        now = self.w.clock()
        with self.w.tx() as c:
            job = self._fenced_job(c, job_id, fence)
            if job is None or job.state != J.LAUNCHING:
                return False
            self.w.move_job(c, job, J.ACTIVE, now, handle_json=json.dumps(handle), launched_at=now)
            self.w.launched(c, job, now)
            return True

    def follow(self, job_id: str, handle: dict[str, Any], fence: Fence | None = None) -> bool:
        """The job's execution ended refused its attempt's claim while another execution of the
        attempt holds it and runs: the job follows that one from now on (its handle replaced).
        With a `fence`, only while the lease is still held (raises `leases.Fenced`)."""
        now = self.w.clock()
        with self.w.tx() as c:
            job = self._fenced_job(c, job_id, fence)
            if job is None or job.state != J.ACTIVE:
                return False
            self.db.run(c, jq.UPDATE_JOB, {"_jid": job_id, "handle_json": json.dumps(handle)})
            self.w.event(c, job.task_id, "followed", None, None, job.attempt,
                         {"job_id": job_id, "job_name": job.job_name}, now)
            return True

    def _fenced_job(self, c: Connection, job_id: str, fence: Fence | None) -> JobRow | None:
        """The job, read inside the transaction `c` once the lease `fence` (if any) is checked
        (raises `leases.Fenced`)."""
        if fence is not None:
            self.leases.check(c, fence)
        rows = self.db.rows(c, jq.GET_JOB_BY_ID, {"job_id": job_id})
        return JobRow.from_row(rows[0]) if rows else None

    def drop_unlaunched(self, ref: ids.AttemptRef, error: dict[str, Any]) -> None:
        """A cancel arrived before the job was launched (or the launch found nothing): the task
        is cancelled with `error` and the launch intent is dropped, in one transaction."""
        now = self.w.clock()
        with self.w.tx() as c:
            task = self.w.lock_task(c, ref.task_id)
            if task is None or task.attempt != ref.number or task.state not in (S.CANCEL_REQUESTED, S.CANCELLING):
                return
            job = self.w.job(c, ref)
            if job is not None and job.state == J.LAUNCHING:
                self.w.move_job(c, job, J.DROPPED, now)
            if task.state == S.CANCEL_REQUESTED:
                task = self.w.transition(c, task, S.CANCELLING, kind="cancelling", now=now)
            self.w.transition(c, task, S.CANCELLED, kind="cancelled", detail={"note": "stopped before launch"},
                              values={"error_json": json.dumps(error)}, now=now)

    # ---- watching -----------------------------------------------------------------------------
    def get(self, ref: ids.AttemptRef) -> JobRow | None:
        rows = self.db.fetch(jq.GET_JOB, {"task_id": ref.task_id, "attempt": ref.number})
        return JobRow.from_row(rows[0]) if rows else None

    def of_task(self, task_id: str) -> list[JobRow]:
        """Every attempt's job of a task."""
        return self.db.fetch(jq.JOBS_OF_TASK, {"task_id": task_id}, into=JobRow.many)

    def moves_by_placement(self, status: str) -> list[tuple[str, int, str, int]]:
        """(tool, placement index, provider, jobs) of the jobs on file that ended with provider
        status `status` (the placer's word for an attempt moved off its placement), by placement."""
        return [(r["tool_name"], r["placement"], r["provider"], r["moves"])
                for r in self.db.fetch(jq.MOVES_BY_PLACEMENT, {"status": status})]

    def watched_pages(self, size: int, now: float | None = None) -> Iterator[list[WatchedJob]]:
        """Jobs the reconciler watches, with what it needs of their task, `size` at a time (each
        page its own read, from where the last one stopped). Each job watched throughout the
        walk comes exactly once; one that starts being watched meanwhile may come or not.

        Tasks are read once per walk, only those that need more than a poll
        (`job_queries.ATTENTION_TASKS`: scheduled, cancel requested, cancelling, running past their
        timeout at `now`). Every other task with an active job is running that job's attempt
        within its timeout: an attempt's end moves its job out of `active` in the same
        transaction (`AttemptTx.end`). A task that changed since the walk began is seen as it
        was, or as running: the next cycle sees it as it is. A draining job's task is not read
        (the job is stopped whatever the task does)."""
        now = self.w.clock() if now is None else now
        tasks = {t[0]: (t[1], t[2], t[3], _TASK_STATES[t[4]])
                 for t in self.db.fetch(jq.ATTENTION_TASKS, {"now": now}, into=_tuples)}
        after: tuple[float, str] = (float("-inf"), "")
        while True:
            rows = self.db.fetch(jq.WATCHED_PAGE, {"after_ts": after[0], "after_jid": after[1], "lim": size},
                                 into=_tuples)
            if rows:
                yield WatchedJob.of_jobs(rows, tasks)
            if len(rows) < size:
                return
            after = (rows[-1][11], rows[-1][0])  # created_at, job_id

    def watched(self) -> list[WatchedJob]:
        """Every job the reconciler watches (the walk of `watched_pages` in one list)."""
        return [j for page in self.watched_pages(2000) for j in page]

    def set_provider_status(self, updates: list[tuple[str, str, str | None]]) -> None:
        """Record what the provider said, (job id, status word, reason), many in one statement.
        A cloud's words are kept as text every engine stores: the status word cut to its column
        (32 characters, which PostgreSQL enforces) and NUL in either replaced by U+FFFD."""
        if updates:
            with self.w.tx() as c:
                self.db.run_many(c, jq.SET_PROVIDER_STATUS, [{"jid": w, "st": _storable(st)[:32], "rs": _storable(rs)}
                                                            for w, st, rs in updates])

    def mark_stop_sent(self, job_id: str, fence: Fence | None = None, margin_s: float = 0.0) -> float:
        """Record a stop about to be sent. With a `fence`, only while the lease is still held
        with `margin_s` to spare (raises `leases.Fenced`: the stop must not be sent)."""
        now = self.w.clock()
        with self.w.tx() as c:
            if fence is not None:
                self.leases.check(c, fence, margin_s)
            self.db.run(c, jq.MARK_STOP_SENT, {"jid": job_id, "now": now})
        return now

    def begin_move(self, job_id: str, status: str, reason: str, fence: Fence | None = None) -> bool:
        """Record that the job is to be stopped and its attempt moved elsewhere (`status`, the
        move's word, and `reason` as its provider status), while its attempt is current and its
        task has not started it. With a `fence`, only while the lease is held (raises
        `leases.Fenced`). True once recorded: a restart finds the move in the job's row."""
        with self.w.tx() as c:
            job = self._fenced_job(c, job_id, fence)
            task = self.w.lock_task(c, job.task_id) if job is not None else None
            if job is None or task is None or job.state != J.ACTIVE or task.attempt != job.attempt or task.state != S.SCHEDULED:
                return False
            self.db.run(c, jq.UPDATE_JOB, {"_jid": job_id, "provider_status": _storable(status)[:32],
                                          "provider_reason": _storable(reason)})
            return True

    def cancel_move(self, job_id: str, fence: Fence | None = None) -> None:
        """A move given up (the job's runner claimed its attempt first: it runs): the job's
        provider status is the provider's word again from the next poll on."""
        with self.w.tx() as c:
            if self._fenced_job(c, job_id, fence) is not None:
                self.db.run(c, jq.UPDATE_JOB, {"_jid": job_id, "provider_status": None, "provider_reason": None})

    @rerun_on_conflict
    def note_refused_claim(self, ref: ids.AttemptRef) -> None:
        """A claim of the attempt was refused to an extra execution: counted on the attempt's job
        (`extra_claims`), for the reconciler to stop that execution and the operator to see it.
        Its transaction is run again when PostgreSQL aborts it for a conflict (`store.conflicts`)."""
        with self.w.tx() as c:
            self.db.run(c, jq.NOTE_REFUSED_CLAIM, {"_tid": ref.task_id, "_att": ref.number})

    def extra_checked(self, job_id: str, seen: int, stopped: int, fence: Fence | None = None) -> None:
        """The reconciler looked into the job's first `seen` refused claims and stopped `stopped`
        extra executions. With a `fence`, only while the lease is still held (raises
        `leases.Fenced`)."""
        with self.w.tx() as c:
            if fence is not None:
                self.leases.check(c, fence)
            self.db.run(c, jq.EXTRA_CHECKED, {"_jid": job_id, "_seen": seen, "_stopped": stopped})

    def move(self, job_id: str, to: JobState) -> None:
        """A watched job's state (draining -> done, ... -> abandoned), if the move is legal now. A
        job that ends after its task was purged goes with it (the purge keeps only watched jobs)."""
        now = self.w.clock()
        with self.w.tx() as c:
            job = self._fenced_job(c, job_id, None)
            if job is None or job.state == to:
                return
            if to in (J.DONE, J.DROPPED) and not self.db.rows(c, q.GET_TASK, {"task_id": job.task_id}):
                states.check_job(job_id, job.state, to)
                self.db.run(c, q.DELETE_JOB, {"_jid": job_id})
                return
            self.w.move_job(c, job, to, now)

    def for_operator(self, job_states: Sequence[str] | None = None, limit: int = 100) -> list[JobRow]:
        """Jobs for the operator, newest first (all states, or `job_states`)."""
        with self.db.read() as c:
            return [JobRow.from_row(r) for r in c.execute(q.operator_jobs(job_states, limit)).mappings()]

    # ---- the runner's credentials -------------------------------------------------------------
    @rerun_on_conflict
    def claim_runner_secret(self, ref: ids.AttemptRef, nonce_digest: str) -> bool | None:
        """Record the one runner allowed the attempt's secret: True for the first claim and for a
        repeat with the same nonce, False for any other nonce, None if the attempt is not current.
        Its transaction is run again when PostgreSQL aborts it for a conflict (`store.conflicts`)."""
        with self.w.tx() as c:
            rows = self.db.rows(c, q.TASK_ATTEMPT, {"task_id": ref.task_id})
            if not rows or rows[0]["attempt"] != ref.number or TaskState(rows[0]["state"]) in FINAL:
                return None
            return self.db.count(c, jq.CLAIM_SECRET, {"_tid": ref.task_id, "_att": ref.number, "_digest": nonce_digest}) == 1
