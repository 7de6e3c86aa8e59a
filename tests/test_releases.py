"""Releasing many waiting children in bounded batches, on SQLite and PostgreSQL: a parent's end
settles one batch of its many waiting children in its own commit and the reconciler the rest,
across a restart half way; a failed parent's DEPENDENCY_FAILED fan-out and a cascading cancel
go the same way; a real server's reconciler loop runs the children beyond its first batch; and
on PostgreSQL two replicas settling at once end each child exactly once.
The longest single transaction is printed (run with -s), not asserted.

Size: `CONTROLPLANE_TEST_RELEASE_CHILDREN` children (2,000 by default, which CI runs) in batches of
a twentieth (100): the same shape as the 10,000 in batches of 500 the figures in
docs/design/dependencies.md were measured with (run them with the variable at 10000)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
from controlplane.states import TaskState
from tests.callers import alice, token_server  # noqa: F401
from tests.conftest import FAST, Agent, ServerProcess
from tests.test_dependencies import new_task, submit, timeline

S = TaskState
CHILDREN = int(os.environ.get("CONTROLPLANE_TEST_RELEASE_CHILDREN", "2000"))
BATCH = CHILDREN // 20


@pytest.fixture
def server(server_process: ServerProcess, home: Path) -> ServerProcess:
    return token_server(server_process, home, release_batch=2)


def control_plane(home: Path) -> ControlPlane:
    return ControlPlane(Settings(home=home, **FAST, release_batch=BATCH, release_cycle_s=0.3))


def running_parent(cp: ControlPlane) -> str:
    tid = cp.store.tasks.submit(new_task()).task.task_id
    for step in (S.SCHEDULED, S.RUNNING):
        cp.store.tasks.transition(tid, step)
    return tid


def children_of(cp: ControlPlane, parents: tuple[str, ...], n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        done = cp.store.tasks.submit_many([(new_task(parents), ()) for _ in range(min(1000, n - len(out)))])
        out += [s.task.task_id for s in done if not isinstance(s, Exception)]
    return out


def states_of(cp: ControlPlane, ids: list[str]) -> dict[str, int]:
    """How many of `ids` are in each state."""
    with cp.db.engine.connect() as c:
        rows = c.execute(text("SELECT task_id, state FROM tasks")).all()
    wanted = set(ids)
    out: dict[str, int] = {}
    for tid, state in rows:
        if tid in wanted:
            out[state] = out.get(state, 0) + 1
    return out


def events_per_task(cp: ControlPlane, kind: str) -> dict[str, int]:
    """How many `kind` events each task has in its audit."""
    with cp.db.engine.connect() as c:
        rows = c.execute(text("SELECT task_id, COUNT(*) FROM task_events WHERE kind = :k GROUP BY task_id"),
                         {"k": kind}).all()
    return {tid: n for tid, n in rows}


class Longest:
    """The longest of the transactions timed through it."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args, **kw)
        self.s = max(self.s, time.perf_counter() - t)
        return out


def finish_after_restart(home: Path, cp: ControlPlane) -> ControlPlane:
    """The server stops half way; a new one's reconciler cycles settle what is left."""
    cp.db.dispose()
    cp = control_plane(home)
    for _ in range(200):
        stats = cp.reconciler.cycle_sync()
        if not stats.releases_left and cp.store.tasks.settle_left() is None:
            break
    return cp


def test_thousands_of_children_are_released_and_a_restart_half_way_finishes(engine: str, home: Path) -> None:
    cp = control_plane(home)
    parent = running_parent(cp)
    kids = children_of(cp, (parent,), CHILDREN)
    longest = Longest()
    longest(cp.store.tasks.transition, parent, S.SUCCEEDED)
    end_s = longest.s
    assert states_of(cp, kids) == {"queued": BATCH, "waiting": CHILDREN - BATCH}, "the first batch in the end's commit"
    for _ in range(9):
        assert longest(cp.store.tasks.settle_left) == BATCH
    assert states_of(cp, kids) == {"queued": 10 * BATCH, "waiting": CHILDREN - 10 * BATCH}
    cp = finish_after_restart(home, cp)
    assert states_of(cp, kids) == {"queued": CHILDREN}
    released = events_per_task(cp, "released")
    assert len(released) == CHILDREN and set(released.values()) == {1}, "each child released exactly once"
    assert cp.store.tasks.queue_depths() == {"cpu_small": CHILDREN}
    print(f"\n[{engine}] {CHILDREN} children, batch {BATCH}: the parent's end {end_s * 1000:.0f} ms, "
          f"the longest transaction {longest.s * 1000:.0f} ms")


def test_a_transaction_takes_the_queues_it_releases_into_at_once(engine: str, home: Path) -> None:
    """What two parents' ends left, children of two queues: a follow-up locks the children it
    releases, then both queues' locks in one call, as a submit takes its own, and queues them
    all in one transaction."""
    cp = control_plane(home)
    small, standard = running_parent(cp), running_parent(cp)
    rest = BATCH // 2  # each parent's children beyond its end's batch
    for parent, queue in ((small, "cpu_small"), (standard, "cpu_standard")):
        cp.store.tasks.submit_many([(replace(new_task((parent,)), resource_class=queue), ()) for _ in range(BATCH + rest)])
    for parent in (small, standard):
        cp.store.tasks.transition(parent, S.SUCCEEDED)
    assert [cp.store.tasks.settle_left() for _ in range(2)] == [2 * rest, None]
    assert cp.store.tasks.queue_depths() == {"cpu_small": BATCH + rest, "cpu_standard": BATCH + rest}


def test_children_of_two_parents_left_to_the_follow_up_are_released_once(engine: str, home: Path) -> None:
    """Children waiting for two parents, more than a batch: each parent's end leaves the ones
    beyond its batch to the follow-up, which then walks both parents' rows in one transaction and
    meets each of those children twice. Each is queued once, and none is left waiting."""
    cp = control_plane(home)
    one, two = running_parent(cp), running_parent(cp)
    rest = BATCH // 2
    kids = children_of(cp, (one, two), BATCH + rest)
    for parent in (one, two):
        cp.store.tasks.transition(parent, S.SUCCEEDED)
    for _ in range(10):
        if cp.store.tasks.settle_left() is None:
            break
    assert states_of(cp, kids) == {"queued": BATCH + rest}
    released = events_per_task(cp, "released")
    assert len(released) == BATCH + rest and set(released.values()) == {1}, "each child released once"
    assert cp.store.tasks.queue_depths() == {"cpu_small": BATCH + rest}


@pytest.mark.anyio
async def test_a_server_runs_every_child_beyond_the_first_batch(alice: Agent, home: Path) -> None:
    """`controlplane serve` with batches of 2: the children its reconciler releases run too, and a
    failed parent's children beyond the batch end DEPENDENCY_FAILED, through the MCP tools."""
    ok = await submit(alice, sleep_s=0.5)
    bad = await submit(alice, sleep_s=0.5, exit_code=3)
    kids = [await submit(alice, [parent["task_id"]]) for parent in (ok, bad) for _ in range(7)]
    assert {k["state"] for k in kids} == {"waiting"}
    ends = [await alice.wait(k["task_id"], timeout=90) for k in kids]
    assert [e["state"] for e in ends] == ["succeeded"] * 7 + ["failed"] * 7
    assert {e["error"]["code"] for e in ends[7:]} == {"DEPENDENCY_FAILED"}
    assert ("released", "waiting", "queued") in timeline(home, kids[6]["task_id"])


def test_a_failed_parents_fan_out_ends_every_descendant_once(engine: str, home: Path) -> None:
    """Thousands of children and grandchildren beyond the first batch: all end DEPENDENCY_FAILED, each
    naming the parent it waited for, across a restart."""
    cp = control_plane(home)
    parent = running_parent(cp)
    kids = children_of(cp, (parent,), CHILDREN)
    grandkids = {k: children_of(cp, (k,), 1)[0] for k in (kids[0], kids[BATCH + 7], kids[-1])}
    longest = Longest()
    longest(cp.store.tasks.transition, parent, S.FAILED)
    assert states_of(cp, kids) == {"failed": BATCH, "waiting": CHILDREN - BATCH}
    for _ in range(5):
        longest(cp.store.tasks.settle_left)
    cp = finish_after_restart(home, cp)
    assert states_of(cp, kids + list(grandkids.values())) == {"failed": CHILDREN + len(grandkids)}
    ended = events_per_task(cp, "dependency_failed")
    assert len(ended) == CHILDREN + len(grandkids) and set(ended.values()) == {1}
    for child, grandchild in grandkids.items():
        error = json.loads(cp.store.tasks.get(grandchild).error_json or "{}")
        assert error["code"] == "DEPENDENCY_FAILED" and error["parent"] == child
    error = json.loads(cp.store.tasks.get(kids[-1]).error_json or "{}")
    assert error["code"] == "DEPENDENCY_FAILED" and error["parent"] == parent and error["parent_state"] == "failed"
    print(f"\n[{engine}] DEPENDENCY_FAILED fan-out: the longest transaction {longest.s * 1000:.0f} ms")


def test_a_cascading_cancel_is_bounded_and_the_parents_end_continues_it(engine: str, home: Path) -> None:
    """cancel_task(cascade) of a running parent cancels a batch of its thousands of waiting children
    and their children at once; the reconciler and the parent's own end (which comes half way)
    cancel the rest, each with the cancel's error, none DEPENDENCY_FAILED."""
    cp = control_plane(home)
    parent = running_parent(cp)
    kids = children_of(cp, (parent,), CHILDREN)
    grandkid = children_of(cp, (kids[-1],), 1)[0]
    answer = cp.service.cancel("alice", api.CancelTask(task_id=parent, reason="enough", cascade=True))
    assert answer["acknowledged"] and answer["state"] == "cancel_requested"
    assert states_of(cp, kids) == {"cancelled": BATCH, "waiting": CHILDREN - BATCH}
    for _ in range(4):
        assert cp.store.tasks.settle_left() == BATCH
    for step in (S.CANCELLING, S.CANCELLED):  # the job is gone: the parent ends, and settles a batch
        cp.store.tasks.transition(parent, step)
    assert states_of(cp, kids) == {"cancelled": 6 * BATCH, "waiting": CHILDREN - 6 * BATCH}
    cp = finish_after_restart(home, cp)
    assert states_of(cp, [*kids, grandkid]) == {"cancelled": CHILDREN + 1}
    cancelled = events_per_task(cp, "cancelled")
    assert all(cancelled[k] == 1 for k in [*kids, grandkid])
    assert not events_per_task(cp, "dependency_failed")
    error = json.loads(cp.store.tasks.get(grandkid).error_json or "{}")
    assert error["code"] == "CANCELLED" and parent in error["message"] and "enough" in error["message"]


def test_two_replicas_settling_at_once_end_each_child_exactly_once(engine: str, home: Path) -> None:
    """Replica one's reconciler settles what a cascading cancel left while replica two ends the
    parent (which continues the same cascade), and both settle what four other parents' ends
    left: every child ends once, and nothing waits for the other forever."""
    if engine != "postgres":
        pytest.skip("needs writers that are not serialised (PostgreSQL)")
    one, two = control_plane(home), control_plane(home)
    cancelled = running_parent(one)
    ended = [running_parent(one) for _ in range(4)]
    doomed = children_of(one, (cancelled,), CHILDREN * 2 // 5)
    freed = [k for p in ended for k in children_of(one, (p,), CHILDREN * 3 // 20)]
    one.service.cancel("alice", api.CancelTask(task_id=cancelled, reason="stop", cascade=True))
    for p in ended:
        one.store.tasks.transition(p, S.SUCCEEDED)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def settle(cp: ControlPlane) -> None:
        start.wait()
        idle = 0
        while idle < 3:  # a release another transaction holds is passed over: look again
            idle = idle + 1 if cp.store.tasks.settle_left() is None else 0
            time.sleep(0.01 * idle)

    def end_the_cancelled_parent() -> None:
        start.wait()
        for step in (S.CANCELLING, S.CANCELLED):
            two.store.tasks.transition(cancelled, step)

    def guarded(run: Callable[..., None], *args: Any) -> None:
        try:
            run(*args)
        except BaseException as e:  # (reported below: a thread's exception is otherwise only printed)
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=guarded, args=args) for args in
               ((settle, one), (settle, two), (end_the_cancelled_parent,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert one.store.tasks.settle_left() is None
    assert states_of(one, doomed) == {"cancelled": len(doomed)}
    assert states_of(one, freed) == {"queued": len(freed)}
    assert set(events_per_task(one, "released").values()) == {1} and len(events_per_task(one, "released")) == len(freed)
    counts = events_per_task(one, "cancelled")
    assert all(counts[k] == 1 for k in doomed)
    assert not events_per_task(one, "dependency_failed")
    assert one.store.tasks.queue_depths() == {"cpu_small": len(freed)}
