"""The retention sweep: expiring finished tasks past their ttl and purging tombstones and the old
audit, in bounded batches within a budget per reconciler cycle.

A store that keeps months of history can have hundreds of thousands of tasks due at once (after
a downtime, or a busy day a ttl ago). One sweep over all of them would hold the reconciler (and
its polls of running jobs) for minutes, and one transaction over them the write lock (every
submit waits behind it). So each cycle:

* expires due tasks `retention_batch` at a time: their objects are deleted and what their jobs
  left at their providers released first (a local job's directory; each job by the provider it
  ran on), task by task; then the batch's log and artifact rows go and the tasks become
  tombstones in one short transaction (a log longer than
  LOG_ROWS_PER_TX lines is deleted in slices of that size first, each its own transaction);
* walks each terminal state's due tasks from a cursor kept between cycles, so the next cycle
  resumes where this one stopped; a task whose deletion failed (or whose job still runs, or
  whose artifact a task that can still run refers to: `held_artifacts`) is
  left behind the cursor and tried again on the next pass (the next cycle, unless a backlog
  spans several), never skipped;
* deletes expired uploads, `retention_batch` at a time: each one's object (and what its store
  kept of an unfinished one) first, then its row (`held_upload` is where a task that still
  refers to an upload will keep it);
* purges, every PURGE_EVERY_S (or at once while a backlog is left), tombstones, then the sweeps
  none of whose shards is left, then audit events, `retention_batch` rows per transaction;
* stops starting batches once `retention_cycle_s` is spent (always running at least one of each
  kind, so neither starves the other), and says when work was left (`Swept.more`).

It owns no rows (those are `store.retention`'s) and calls no provider but `release`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from controlplane.objectstore.base import task_prefix, upload_prefix
from controlplane.objectstore.registry import ObjectStores
from controlplane.settings import Settings
from controlplane.states import TERMINAL, TaskState
from controlplane.store import Store, inputs
from controlplane.store.retention import Expiring
from controlplane_providers.base import MalformedHandle, Provider

log = logging.getLogger("controlplane.retention")
R = TypeVar("R")
PURGE_EVERY_S = 600.0
LOG_ROWS_PER_TX = 20_000
START = (float("-inf"), 0)
ORDER = sorted(TERMINAL, key=lambda s: s.value)  # the states a pass walks, one after the other


@dataclass
class Swept:
    expired: int = 0
    purged: int = 0  # tombstones
    sweeps_purged: int = 0  # sweeps whose shards were all purged
    events_purged: int = 0
    uploads_expired: int = 0
    batches: int = 0  # write transactions
    batches_s: float = 0.0  # their total time, and the longest one's (how long a submit may wait)
    longest_batch_s: float = 0.0
    more: bool = False  # the budget ran out with work left


class Retention:
    log_rows_per_tx = LOG_ROWS_PER_TX

    def __init__(self, store: Store, object_stores: ObjectStores, providers: dict[str, Provider[Any]], settings: Settings):
        self.store = store
        self.object_stores = object_stores
        self.providers = providers
        self.settings = settings
        self._after: dict[TaskState, tuple[float, int]] = {}  # each state's cursor, kept between cycles
        self._last_purge = 0.0
        self._purge_left = False

    def sweep(self, now: float) -> Swept:
        out = Swept()
        deadline = time.monotonic() + self.settings.retention_cycle_s
        self._expire(now, deadline, out)
        self._expire_uploads(now, deadline, out)
        if self._purge_left or now - self._last_purge >= PURGE_EVERY_S:
            self._last_purge = now
            self._purge_left = self._purge(now, deadline, out)
            out.more = out.more or self._purge_left
        return out

    @staticmethod
    def _timed(out: Swept, fn: Callable[..., R], *args: Any) -> R:
        """One write transaction of the sweep, counted and timed (the longest is how long a
        submit may have waited for the write lock behind it)."""
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - t0
            out.batches += 1
            out.batches_s += took
            out.longest_batch_s = max(out.longest_batch_s, took)

    # ---- expiry ---------------------------------------------------------------------------------
    def _expire(self, now: float, deadline: float, out: Swept) -> None:
        size = self.settings.retention_batch
        first = True
        for state in ORDER:
            while True:
                due = self.store.retention.due_for_expiry(now, state, self._after.get(state, START), size)
                if not due:
                    self._after.pop(state, None)  # this state's pass is over: the next starts afresh
                    break
                if not first and time.monotonic() >= deadline:
                    out.more = True
                    return
                first = False
                self._after[state] = (due[-1].expires_at, due[-1].pk)
                ready = [t for t in due if self._let_go(t, out)]
                out.expired += len(self._expire_batch(ready, out))
                if len(due) < size:
                    self._after.pop(state, None)
                    break

    def _expire_batch(self, tasks: list[Expiring], out: Swept) -> list[str]:
        """Expire `tasks` in transactions of at most log_rows_per_tx log lines (and at least one task)."""
        done: list[str] = []
        batch: list[str] = []
        rows = 0
        for t in tasks:
            lines = min(t.log_lines, self.log_rows_per_tx)  # a longer log was sliced down to this (_let_go)
            if batch and rows + lines > self.log_rows_per_tx:
                done += self._timed(out, self.store.retention.expire, batch)
                batch, rows = [], 0
            batch.append(t.task_id)
            rows += lines
        if batch:
            done += self._timed(out, self.store.retention.expire, batch)
        return done

    def _let_go(self, t: Expiring, out: Swept) -> bool:
        """Delete what the task keeps outside its rows: its objects, what its provider keeps of its
        jobs, and (in slices) a long log. False: not now (retried on the next pass), also while
        a task that can still run refers to one of its artifacts (`held_artifacts`)."""
        if self.held_artifacts(t.task_id):
            return False
        try:
            self.object_stores.get(t.store_url).delete_prefix(task_prefix(t.task_id))
            if not self._release(t.task_id):
                return False  # a job of the task still runs and keeps its things: ask again next pass
        except Exception as e:  # noqa: BLE001 - retried next pass; the task stays until it works
            log.warning("deleting the objects of %s failed (will retry): %s", t.task_id, e)
            return False
        below = t.log_first_seq
        while t.log_seq - below + 1 > self.log_rows_per_tx:  # the last slice goes with the task
            below += self.log_rows_per_tx
            self._timed(out, self.store.retention.drop_logs, t.task_id, below)
        return True

    def _release(self, task_id: str) -> bool:
        """What its provider keeps of each of the task's jobs (a local job's directory) goes too,
        each job with the provider of the placement it ran on. False: a job still runs (and
        keeps what it has)."""
        released = []
        for job in self.store.jobs.of_task(task_id):
            provider = self.providers.get(job.provider)
            if provider is not None and job.handle_json:
                try:
                    handle = provider.handle(job.handle_json)
                except MalformedHandle as e:  # nothing it names can be found again: nothing to release
                    log.warning("job %s of expiring task %s: %s", job.job_name, task_id, e)
                    continue
                released.append(provider.release(handle))
        return all(released)

    # ---- uploads -------------------------------------------------------------------------------
    def _expire_uploads(self, now: float, deadline: float, out: Swept) -> None:
        """Expired uploads and their objects, a batch at a time until none is left or the budget
        is spent (one batch always). One whose deletion fails stays and is tried next cycle."""
        size = self.settings.retention_batch
        failed: set[str] = set()
        while True:
            due = [u for u in self.store.uploads.due(now, size + len(failed)) if u.upload_id not in failed]
            for u in due:
                if self.held_upload(u.upload_id):
                    failed.add(u.upload_id)
                    continue
                try:
                    objects = self.object_stores.get(u.store_url)
                    objects.abort_upload(u.storage_key, u.session)
                    objects.delete_prefix(upload_prefix(u.upload_id))
                except Exception as e:  # noqa: BLE001 - retried next cycle
                    log.warning("deleting upload %s failed (will retry): %s", u.upload_id, e)
                    failed.add(u.upload_id)
                    continue
                if self._timed(out, self.store.uploads.delete, u.upload_id):
                    out.uploads_expired += 1
            if len(due) < size:
                return
            if time.monotonic() >= deadline:
                out.more = True
                return

    def held_upload(self, upload_id: str) -> bool:
        """Whether an expired upload must stay: a task that can still run (not in a final state)
        refers to it (`task_inputs`), so it stays until that task ends."""
        return inputs.held(self.store.db, f"upload://{upload_id}")

    def held_artifacts(self, task_id: str) -> bool:
        """Whether a finished task must stay past its ttl: a task that can still run (not in a
        final state) refers to one of its artifacts (`task_inputs`), so the task, its artifacts
        and their objects stay until that task ends."""
        return inputs.artifacts_held(self.store.db, task_id)

    # ---- purging --------------------------------------------------------------------------------
    def _purge(self, now: float, deadline: float, out: Swept) -> bool:
        """Tombstones, then sweeps left without shards, then old events, a batch per transaction.
        True: work was left."""
        size = self.settings.retention_batch
        r = self.store.retention
        for fn, before, field in ((r.purge_tombstones, now - self.settings.purge_after_s, "purged"),
                                  (r.purge_sweeps, now - self.settings.purge_after_s, "sweeps_purged"),
                                  (r.purge_events, now - self.settings.audit_retention_s, "events_purged")):
            while (n := self._timed(out, fn, before, size)) == size:  # a full batch: maybe more
                setattr(out, field, getattr(out, field) + n)
                if time.monotonic() >= deadline:
                    return True
            setattr(out, field, getattr(out, field) + n)
        return False
