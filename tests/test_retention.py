"""Expiry and purging in bounded batches: a backlog larger than a batch is worked off over
several cycles, each batch in a transaction of its own (a long log in slices), a task whose
objects could not be deleted is tried again on the next pass without holding up the others, and
purging takes tombstones and old audit events a batch at a time while the audit of live tasks
stays."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from controlplane.app import ControlPlane
from controlplane.objectstore.base import task_prefix
from controlplane.settings import Settings
from controlplane.store import NewTask

DAY = 86_400.0


def control_plane(home: Path, **settings: Any) -> ControlPlane:
    return ControlPlane(Settings(home=home, **settings))


def finished(cp: ControlPlane, n: int, *, log_lines: int = 0, past_ttl: bool = True) -> list[str]:
    """`n` tasks that ended (cancelled while queued), past their ttl unless told otherwise, each
    with `log_lines` lines of log and an object in the store."""
    ids = []
    for _ in range(n):
        new = NewTask(owner="local", tool_name="exercise", inputs_json="{}", input_size=None, provider="local",
                      resource_class="cpu_small", priority=0, ttl_s=3600, idempotency_key=None, tags=["t"],
                      resources_json="{}", max_runtime_s=60, max_attempts=1, estimate_s=1.0)
        tid = cp.store.tasks.submit(new).task.task_id
        cp.store.tasks.request_cancel(tid, "local", "test", {"code": "CANCELLED", "message": "test"})
        cp.object_stores.default.put_bytes(f"{task_prefix(tid)}attempts/1/result.json", b"{}", content_type="application/json")
        with cp.db.write() as c:
            if log_lines:
                c.execute(text("INSERT INTO task_logs (task_id, seq, attempt, ts, stream, level, message) "
                               "VALUES (:t, :s, 1, 0, 'stdout', 'info', 'x')"),
                          [{"t": tid, "s": s} for s in range(1, log_lines + 1)])
            c.execute(text("UPDATE tasks SET log_seq = :n, expires_at = :e WHERE task_id = :t"),
                      {"n": log_lines, "e": time.time() - 60 if past_ttl else time.time() + DAY, "t": tid})
        ids.append(tid)
    return ids


def states(cp: ControlPlane, ids: list[str]) -> list[str | None]:
    return [t.state.value if (t := cp.store.tasks.get(tid)) else None for tid in ids]


def log_count(cp: ControlPlane) -> int:
    with cp.db.read() as c:
        return c.execute(text("SELECT COUNT(*) FROM task_logs")).scalar_one()


def test_a_backlog_larger_than_a_batch_expires_over_cycles(home: Path) -> None:
    cp = control_plane(home, retention_batch=3, retention_cycle_s=0)  # one batch per cycle
    due = finished(cp, 7, log_lines=2)
    live = finished(cp, 2, past_ttl=False)
    swept = [cp.reconciler.retention.sweep(time.time()) for _ in range(3)]
    assert [s.expired for s in swept] == [3, 3, 1]
    assert [s.more for s in swept] == [True, True, False]  # the last cycle found nothing left
    assert states(cp, due) == ["expired"] * 7 and states(cp, live) == ["cancelled"] * 2
    assert log_count(cp) == 0
    assert all(list(cp.object_stores.default.list(task_prefix(t))) == [] for t in due)
    assert all(list(cp.object_stores.default.list(task_prefix(t))) for t in live)
    assert cp.reconciler.retention.sweep(time.time()).expired == 0


def test_each_batch_is_a_transaction_of_its_own(home: Path) -> None:
    cp = control_plane(home, retention_batch=3, retention_cycle_s=60)  # the whole backlog in one cycle
    due = finished(cp, 7)
    commits = []
    event.listen(cp.db.engine, "commit", lambda conn: commits.append(conn))
    swept = cp.reconciler.retention.sweep(time.time())
    assert swept.expired == 7 and not swept.more
    assert swept.batches == len(commits) >= 3 + 1  # 3 + 3 + 1 tasks, and one purge batch of each kind
    assert states(cp, due) == ["expired"] * 7


def test_a_long_log_is_deleted_in_slices(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = control_plane(home, retention_batch=10, retention_cycle_s=60)
    retention = cp.reconciler.retention
    monkeypatch.setattr(retention, "log_rows_per_tx", 20)
    long_log, *short = finished(cp, 3, log_lines=50)
    deleted_per_tx = []
    for name in ("drop_logs", "expire"):
        inner = getattr(cp.store.retention, name)

        def counted(*args: Any, _inner: Any = inner) -> Any:
            before = log_count(cp)
            result = _inner(*args)
            deleted_per_tx.append(before - log_count(cp))
            return result

        monkeypatch.setattr(cp.store.retention, name, counted)
    assert retention.sweep(time.time()).expired == 3
    assert states(cp, [long_log, *short]) == ["expired"] * 3
    assert sum(deleted_per_tx) == 150 and max(deleted_per_tx) <= 20


class FailingFor:
    """The object store, failing every deletion under one task's prefix while `failing`."""

    def __init__(self, inner: Any, task_id: str):
        self.inner, self.prefix, self.failing = inner, task_prefix(task_id), True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def delete_prefix(self, prefix: str) -> int:
        if self.failing and prefix == self.prefix:
            raise OSError("object store unavailable")
        return self.inner.delete_prefix(prefix)


def test_a_failed_deletion_is_retried_next_cycle_and_holds_up_no_other_task(home: Path) -> None:
    cp = control_plane(home, retention_batch=3, retention_cycle_s=60)
    due = finished(cp, 7)
    store = FailingFor(cp.object_stores.default, due[1])
    cp.object_stores._stores[cp.object_stores.default_url] = store  # type: ignore[assignment]
    assert cp.reconciler.retention.sweep(time.time()).expired == 6
    assert states(cp, due) == ["expired", "cancelled"] + ["expired"] * 5  # kept, with its objects
    assert list(store.list(task_prefix(due[1])))
    assert cp.reconciler.retention.sweep(time.time()).expired == 0  # still failing: still kept
    store.failing = False
    assert cp.reconciler.retention.sweep(time.time()).expired == 1
    assert states(cp, due) == ["expired"] * 7 and list(store.list(task_prefix(due[1]))) == []


def test_purge_takes_tombstones_and_old_events_in_batches_and_keeps_the_audit_of_live_tasks(home: Path) -> None:
    cp = control_plane(home, retention_batch=3, retention_cycle_s=0, purge_after_s=0,
                       audit_retention_s=DAY)
    gone = finished(cp, 5)
    live = finished(cp, 2, past_ttl=False)
    with cp.db.write() as c:  # the tombstones' audit is older than the audit period
        c.execute(text("UPDATE task_events SET ts = 1000 WHERE task_id = :t"), [{"t": t} for t in gone])
    live_audit = {t: [e.kind for e in cp.store.logs.events(t)] for t in live}
    tombstones, events = [], []
    for _ in range(10):
        swept = cp.reconciler.retention.sweep(time.time())
        tombstones.append(swept.purged)
        events.append(swept.events_purged)
        if not swept.more:
            break
    assert max(tombstones) <= 3 and max(events) <= 3  # a batch at a time, over several cycles
    assert len(tombstones) > 1 and sum(tombstones) == 5
    assert states(cp, gone) == [None] * 5  # purged: NOT_FOUND
    assert sum(events) == 5 * 2  # each one's submitted and cancelled events, older than a day
    # what is left of their audit is recent (their expiry): it stays for the audit period, as
    # does all of the audit of the tasks still on file
    assert [[e.kind for e in cp.store.logs.events(t)] for t in gone] == [["expired"]] * 5
    assert {t: [e.kind for e in cp.store.logs.events(t)] for t in live} == live_audit
    assert states(cp, live) == ["cancelled"] * 2


def job_rows(cp: ControlPlane, task_id: str) -> list[tuple[str, str]]:
    with cp.db.read() as c:
        return [tuple(r) for r in c.execute(text("SELECT job_id, state FROM jobs WHERE task_id = :t"), {"t": task_id})]


def test_a_job_still_draining_when_its_task_is_purged_goes_once_it_ends(home: Path) -> None:
    """The reconciler keeps watching a draining job after its task's tombstone is purged (the
    cloud job may still run), and the job's row goes when the job ends, not left for ever."""
    from controlplane.states import JobState

    cp = control_plane(home, retention_batch=10, retention_cycle_s=0, purge_after_s=0)
    [tid] = finished(cp, 1)
    with cp.db.write() as c:
        c.execute(text("INSERT INTO jobs (job_id, task_id, attempt, provider, resource_class, job_name, state,"
                       " created_at, event_seq) VALUES ('job_x', :t, 1, 'local', 'cpu_small', 'cp-x-a1', 'draining',"
                       " 1.0, 0)"), {"t": tid})
    for _ in range(5):
        if not cp.reconciler.retention.sweep(time.time()).more:
            break
    assert states(cp, [tid]) == [None]  # the tombstone is purged
    assert job_rows(cp, tid) == [("job_x", "draining")]  # still watched: its cloud job may run
    cp.store.jobs.move("job_x", JobState.DONE)
    assert job_rows(cp, tid) == []
