"""A submit's guards (`controlplane.guards`) run in its own transaction: the batch's locks are
taken together, in one order, before anything is counted; each submit's guards run in their
order and the first refusal is its answer; and under contention from two processes, with claims
on the same queue, no transaction waits for another for ever and every limit holds (both
engines)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.app import ControlPlane
from controlplane.guards import BudgetCheck, CallerLimits, LimitReached, QueueFull, QueueLength, Refused
from controlplane.store import Submitted
from controlplane.store import queries as q
from tests.conftest import record_statements
from tests.test_scheduling import two_processes
from tests.test_states import new_task

COUNTING = {id(s) for s in (q.QUEUE_LEVELS, q.NTH_NEWEST_SUBMIT, q.IN_FLIGHT, q.OWNER_SPENT, q.OWNER_RUNNING,
                            q.TAG_SPENT, q.TAG_RUNNING)}


def budget(scope: str, subject: str, amount: float) -> BudgetCheck:
    return BudgetCheck(scope, subject, "day", amount, time.time() - 3600, time.time() + 3600)


def test_a_batch_takes_every_guards_lock_at_once_and_in_one_order_before_counting(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two callers' submits into two queues, each held to a caller limit and a tag's budget: the
    batch asks for every lock its guards declare in one call, before its first count."""
    bob = dataclasses.replace(new_task("bob"), resource_class="cpu_standard", tags=["proj"])
    alice = dataclasses.replace(new_task("alice"), tags=["proj"])
    seen = record_statements(cp, monkeypatch)
    calls: list[tuple[str, ...]] = []
    lock = cp.db.lock
    monkeypatch.setattr(cp.db, "lock", lambda c, *keys: (calls.append(keys), seen.append("lock"), lock(c, *keys))[2])
    out = cp.store.tasks.submit_many([
        (bob, [CallerLimits(in_flight=10), budget("tag", "proj", 100.0), QueueLength(10)]),
        (alice, [CallerLimits(per_day=10), budget("tag", "proj", 100.0), QueueLength(10)]),
    ])
    assert all(isinstance(o, Submitted) for o in out), out
    assert len(calls) == 1
    assert set(calls[0]) == {"budget:tag:proj", "caller:alice", "caller:bob", "cpu_small", "cpu_standard"}
    assert seen.index("lock") < next(i for i, s in enumerate(seen) if id(s) in COUNTING)


def test_locks_are_taken_in_one_order_whatever_order_they_are_named_in(cp: ControlPlane,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """What PostgreSQL is asked for: one advisory lock per key, each once, in sorted order (on
    SQLite none: writers are serialised already)."""
    taken: list[Any] = []
    real_execute = type(cp.db.engine.connect()).execute
    with cp.db.write() as c:
        monkeypatch.setattr(type(c), "execute", lambda self, stmt, params=None, **kw: (
            taken.append(params) if "pg_advisory_xact_lock" in str(stmt) else None, real_execute(self, stmt, params, **kw))[1])
        cp.db.lock(c, "queue", "caller:bob", "budget:tag:a", "caller:bob", "caller:alice")
    keys = [p["k"] for p in taken]
    if cp.db.is_sqlite:
        assert keys == []
    else:
        names = sorted({"queue", "caller:bob", "budget:tag:a", "caller:alice"})
        assert keys == [int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big", signed=True) for n in names]


def test_a_submits_guards_run_in_their_order_and_the_first_refusal_is_its_answer(cp: ControlPlane) -> None:
    """A caller allowed no submit, into a full queue: the caller's limit answers, as it came
    first, and nothing is written; with the queue's guard first the queue answers."""
    cp.store.tasks.submit(new_task(), [QueueLength(1)])
    with pytest.raises(LimitReached) as refused:
        cp.store.tasks.submit(new_task(), [CallerLimits(per_minute=0), QueueLength(1)])
    assert refused.value.limit == "submits_per_minute" and refused.value.retry_after_s is None
    with pytest.raises(QueueFull):
        cp.store.tasks.submit(new_task(), [QueueLength(1), CallerLimits(per_minute=0)])
    assert cp.store.tasks.count_by_state("cpu_small") == {"queued": 1}


def test_guarded_submits_and_claims_from_two_processes_never_deadlock_and_hold_their_limits(home: Path) -> None:
    """Two processes submit at once for three callers (a limit of 3 tasks in flight each, one
    budget per tag met in either order, two queues) while a claim takes slots of each queue
    again and again: every submit is written or refused by a guard (none aborted by the database
    as a deadlock, none left waiting), and no caller has more than 3 tasks in flight."""
    stores = two_processes(home)
    owners, queues = ["alice", "bob", "carol"], ["cpu_small", "cpu_standard"]
    outcomes: list[Any] = []
    lock = threading.Lock()
    stop = threading.Event()

    def submitter(i: int) -> None:
        store = stores[i % 2]
        for n in range(12):
            owner, queue = owners[(i + n) % 3], queues[(i * n) % 2]
            tags = ["a", "b"] if (i + n) % 2 else ["b", "a"]
            new = dataclasses.replace(new_task(owner), resource_class=queue, tags=tags)
            guards = [CallerLimits(in_flight=3), *(budget("tag", t, 1e9) for t in sorted(tags)), QueueLength(1000)]
            items = [(new, guards), (dataclasses.replace(new, owner=owners[(i + n + 1) % 3]), guards)]
            try:
                got: list[Any] = store.tasks.submit_many(items)
            except Exception as e:  # noqa: BLE001 - a whole batch lost (a deadlock): the test reports it
                got = [e]
            with lock:
                outcomes.extend(got)

    def claimer() -> None:
        try:
            while not stop.is_set():
                for i, queue in enumerate(queues):
                    stores[i].jobs.claim_for_launch(queue, capacity=2)
        except Exception as e:  # noqa: BLE001 - the test reports it
            outcomes.append(e)

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(6)]
    claims = threading.Thread(target=claimer)
    claims.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    claims.join(60)
    assert not any(t.is_alive() for t in [*threads, claims])
    assert not [o for o in outcomes if not isinstance(o, Submitted | Refused)], outcomes
    assert any(isinstance(o, Submitted) for o in outcomes) and any(isinstance(o, LimitReached) for o in outcomes)
    for owner in owners:
        live = [t for t in stores[0].tasks.list(owner, limit=1000) if t.state in ("queued", "scheduled")]
        assert len(live) <= 3, (owner, len(live))
