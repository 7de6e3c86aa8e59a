"""Tasks that wait for others (`submit_task(after=[...])`), through a real MCP client over HTTP
to `controlplane serve` on the local provider: a chain runs in order, a parent that does not
succeed ends its descendants with DEPENDENCY_FAILED naming it, a cancel may cascade, parents are
checked as reads are, waiting survives a restart; and on PostgreSQL, children submitted while
their parents end on another replica never wait forever."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
from controlplane.states import TaskState
from controlplane.store import NewTask
from tests.callers import alice, bob, token_server  # noqa: F401
from tests.conftest import FAST, Agent, ServerProcess, ToolCallError, fast_env, write_catalog
from tests.postgres import Meeting

pytestmark = pytest.mark.anyio

MAX_PARENTS = 3
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


@pytest.fixture
def server(server_process: ServerProcess, home: Path) -> ServerProcess:
    return token_server(server_process, home, max_parents=MAX_PARENTS)


async def submit(agent: Agent, after: list[str] | None = None, **inputs: Any) -> dict[str, Any]:
    return await agent.call("submit_task", tool_name="exercise", inputs=inputs, after=after or [])


def timeline(home: Path, task_id: str) -> list[tuple[str, str | None, str | None]]:
    """The task's audit, as the server wrote it in the database."""
    store = ControlPlane(Settings(home=home)).store
    try:
        return [(e.kind, e.from_state, e.to_state) for e in store.logs.events(task_id)]
    finally:
        store.db.dispose()


def when(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


async def test_a_chain_of_three_runs_in_order(alice: Agent, home: Path) -> None:
    a = await submit(alice, sleep_s=1.0, progress_steps=2)
    b = await submit(alice, [a["task_id"]], sleep_s=0.3)
    c = await submit(alice, [b["task_id"]], result={"last": True})
    for child in (b, c):  # admitted at once, in no queue
        assert child["state"] == "waiting" and child["position"] is None and child["task_id"].startswith("tsk_")
    st = await alice.call("get_task_status", task_id=c["task_id"])
    assert st["state"] == "waiting" and st["waiting_for"] == [b["task_id"]] and st["position"] is None
    waiting = await alice.call("list_tasks", states=["waiting"])
    assert [t["task_id"] for t in waiting["tasks"]] == [c["task_id"], b["task_id"]]
    assert [t["task_id"] for t in (await alice.call("list_tasks", parent=a["task_id"]))["tasks"]] == [b["task_id"]]
    assert [t["task_id"] for t in (await alice.call("list_tasks", parent=b["task_id"]))["tasks"]] == [c["task_id"]]
    assert (await alice.call("list_tasks", parent=c["task_id"]))["tasks"] == []

    done = {t["task_id"]: await alice.wait(t["task_id"], timeout=90) for t in (a, b, c)}
    assert {s["state"] for s in done.values()} == {"succeeded"}
    sa, sb, sc = (done[t["task_id"]] for t in (a, b, c))
    assert when(sa["completed_at"]) <= when(sb["started_at"]) and when(sb["completed_at"]) <= when(sc["started_at"])
    assert "waiting_for" not in sc
    assert timeline(home, b["task_id"])[:3] == [
        ("submitted", None, "waiting"), ("released", "waiting", "queued"), ("scheduled", "queued", "scheduled")]
    # All parents already succeeded: queued at once.
    d = await submit(alice, [a["task_id"], b["task_id"]])
    assert d["state"] == "queued" and d["position"] is not None


async def test_a_failed_parent_ends_its_descendants_naming_it(alice: Agent, home: Path) -> None:
    a = await submit(alice, sleep_s=0.5, exit_code=3)
    b = await submit(alice, [a["task_id"]])
    c = await submit(alice, [b["task_id"]])
    ok = await submit(alice)
    d = await submit(alice, [a["task_id"], ok["task_id"]])  # one parent failing is enough
    assert (await alice.wait(a["task_id"]))["state"] == "failed"
    sb, sc, sd = [await alice.wait(t["task_id"], timeout=30) for t in (b, c, d)]
    assert sb["state"] == sc["state"] == sd["state"] == "failed"
    assert sb["error"]["code"] == sc["error"]["code"] == sd["error"]["code"] == "DEPENDENCY_FAILED"
    assert a["task_id"] in sb["error"]["message"] and "failed" in sb["error"]["message"]
    assert b["task_id"] in sc["error"]["message"] and a["task_id"] in sd["error"]["message"]
    assert sb["started_at"] is None and sc["started_at"] is None  # never ran
    res = await alice.call("get_task_result", task_id=c["task_id"])
    assert res["error"]["code"] == "DEPENDENCY_FAILED"
    assert timeline(home, b["task_id"])[-1] == ("dependency_failed", "waiting", "failed")

    # A parent already failed: the child is admitted (an id, its audit) and ended at once.
    late = await submit(alice, [a["task_id"]])
    assert late["state"] == "failed"
    st = await alice.call("get_task_status", task_id=late["task_id"])
    assert st["error"]["code"] == "DEPENDENCY_FAILED" and a["task_id"] in st["error"]["message"]


async def test_cancel_cascades_or_ends_the_children(alice: Agent) -> None:
    a = await submit(alice, sleep_s=60, progress_steps=60)
    b = await submit(alice, [a["task_id"]])
    c = await submit(alice, [b["task_id"]])
    await alice.wait(a["task_id"], {"running"})
    ack = await alice.call("cancel_task", task_id=a["task_id"], cascade=True, reason="changed my mind")
    assert ack["acknowledged"] is True
    for t in (b, c):  # cancelled with the request, before the parent's job has stopped
        st = await alice.call("get_task_status", task_id=t["task_id"])
        assert st["state"] == "cancelled", st
        assert st["error"]["code"] == "CANCELLED" and a["task_id"] in st["error"]["message"]
    assert (await alice.wait(a["task_id"], timeout=60))["state"] == "cancelled"

    # Without cascade: the children end DEPENDENCY_FAILED, as for any cancelled parent.
    p = await submit(alice, sleep_s=60, progress_steps=60)
    q = await submit(alice, [p["task_id"]])
    await alice.call("cancel_task", task_id=p["task_id"])
    st = await alice.wait(q["task_id"], timeout=60)
    assert st["state"] == "failed" and st["error"]["code"] == "DEPENDENCY_FAILED"
    assert p["task_id"] in st["error"]["message"] and "cancelled" in st["error"]["message"]

    # A waiting task cancelled by itself is cancelled at once; its own children follow it.
    r = await submit(alice, sleep_s=60, progress_steps=60)
    s = await submit(alice, [r["task_id"]])
    t = await submit(alice, [s["task_id"]])
    assert (await alice.call("cancel_task", task_id=s["task_id"]))["state"] == "cancelled"
    st = await alice.call("get_task_status", task_id=t["task_id"])
    assert st["state"] == "failed" and st["error"]["code"] == "DEPENDENCY_FAILED"
    await alice.call("cancel_task", task_id=r["task_id"])
    await alice.wait(r["task_id"], timeout=60)


async def test_parents_are_checked_as_reads_are(alice: Agent, bob: Agent) -> None:
    theirs = (await submit(bob, sleep_s=30))["task_id"]
    unknown = "tsk_" + "a" * 26
    for parent in (theirs, unknown):
        err = await alice.error("submit_task", tool_name="exercise", inputs={}, after=[parent])
        assert err["code"] == "NOT_FOUND" and err["message"] == f"task {parent} named in after not found"
        assert (await alice.error("list_tasks", parent=parent)) == {"code": "NOT_FOUND", "message": "task not found"}
    mine = [(await submit(alice))["task_id"] for _ in range(MAX_PARENTS + 1)]
    err = await alice.error("submit_task", tool_name="exercise", inputs={}, after=mine)
    assert err["code"] == "INVALID_REQUEST" and f"the limit is {MAX_PARENTS}" in err["message"]
    ok = await submit(alice, mine[:MAX_PARENTS] + mine[:1])  # a parent named twice counts once
    assert ok["state"] in ("waiting", "queued")
    assert (await alice.call("list_tasks"))["tasks"][0]["task_id"] == ok["task_id"]  # nothing else was created
    with pytest.raises(ToolCallError):
        await alice.call("submit_task", tool_name="exercise", inputs={}, after="tsk_x")  # not a list
    await bob.call("cancel_task", task_id=theirs)
    for tid in [*mine, ok["task_id"]]:
        await alice.wait(tid, timeout=60)


async def test_children_wait_across_a_restart(home: Path) -> None:
    srv = ServerProcess(home, env=fast_env(home)).start()
    try:
        async with Client(srv.url) as client:
            agent = Agent(client)
            a = await submit(agent, sleep_s=4, progress_steps=4)
            b = await submit(agent, [a["task_id"]], result={"after": "restart"})
            await agent.wait(a["task_id"], {"running"})
        srv.stop()
        srv = ServerProcess(home, env=fast_env(home)).start()
        async with Client(srv.url) as client:
            agent = Agent(client)
            assert (await agent.call("get_task_status", task_id=b["task_id"]))["state"] in ("waiting", "queued",
                                                                                         "scheduled", "running")
            assert (await agent.wait(a["task_id"], timeout=90))["state"] == "succeeded"
            st = await agent.wait(b["task_id"], timeout=60)
            assert st["state"] == "succeeded", st
            assert (await agent.call("get_task_result", task_id=b["task_id"]))["result"]["after"] == "restart"
    finally:
        srv.stop()


# ---- two replicas on one PostgreSQL --------------------------------------------------------------
def new_task(after: tuple[str, ...] = ()) -> NewTask:
    return NewTask(owner="alice", tool_name="exercise", inputs_json="{}", input_size=None, provider="local",
                   resource_class="cpu_small", priority=0, ttl_s=3600, idempotency_key=None, tags=[],
                   resources_json="{}", max_runtime_s=60, max_attempts=1, estimate_s=1.0, after=after)


def test_children_submitted_while_parents_end_never_wait_forever(engine: str, home: Path) -> None:
    """Replica one ends parents (running -> succeeded or failed) while replica two submits
    children naming them, at the same moments: every child whose parents all ended must be
    queued or failed; none may be left waiting."""
    if engine != "postgres":
        pytest.skip("the race needs writers that are not serialised (PostgreSQL)")
    one = ControlPlane(Settings(home=home, **FAST))
    two = ControlPlane(Settings(home=home, **FAST))
    parents = []
    for _ in range(60):
        tid = one.store.tasks.submit(new_task()).task.task_id
        for step in (TaskState.SCHEDULED, TaskState.RUNNING):
            one.store.tasks.transition(tid, step)
        parents.append(tid)
    outcome = {tid: TaskState.SUCCEEDED if i % 5 else TaskState.FAILED for i, tid in enumerate(parents)}
    rng = random.Random(5)
    children: list[tuple[str, tuple[str, ...]]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def end_parents() -> None:
        start.wait()
        for tid in parents:
            one.store.tasks.transition(tid, outcome[tid], values={"started_at": time.time()})

    def submit_children(seed: int) -> None:
        r = random.Random(seed)
        start.wait()
        for _ in range(150):
            after = tuple(sorted(set(r.sample(parents, r.randint(1, 3)))))
            children.append((two.store.tasks.submit(new_task(after)).task.task_id, after))

    def guarded(run: Any, *args: Any) -> None:
        try:
            run(*args)
        except BaseException as e:  # (reported below: a thread's exception is otherwise only printed)
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=guarded, args=(run, *args)) for run, args in
               ((end_parents, ()), (submit_children, (rng.random(),)), (submit_children, (rng.random(),)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(children) == 300
    for child, after in children:
        state = one.store.tasks.get(child).state
        failed = any(outcome[p] == TaskState.FAILED for p in after)
        assert state == (TaskState.FAILED if failed else TaskState.QUEUED), (child, after, state)
    depth = sum(one.store.tasks.queue_depths().values())
    assert depth == sum(1 for child, _ in children if one.store.tasks.get(child).state == TaskState.QUEUED)


def test_a_parents_end_and_a_submit_after_its_child_at_once_never_deadlock(
        engine: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica two submits a task after a waiting child (it holds the child's row shared and then
    takes its queue's lock) as replica one ends the child's parent (it releases the child into
    that queue). Both must commit, the child queued and the new task waiting for it, where the
    end took the queue's lock and then waited for the child's row while the submit, holding the
    row, waited for the lock, which PostgreSQL ended by failing one of them."""
    from controlplane.store.counts import Counts

    if engine != "postgres":
        pytest.skip("the race needs writers that are not serialised (PostgreSQL)")
    one = ControlPlane(Settings(home=home, **FAST))
    two = ControlPlane(Settings(home=home, **FAST))
    try:
        parent = one.store.tasks.submit(new_task()).task.task_id
        for step in (TaskState.SCHEDULED, TaskState.RUNNING):
            one.store.tasks.transition(parent, step)
        child = one.store.tasks.submit(new_task((parent,))).task.task_id
        meeting, lock_parents = Meeting(one.db.engine), Counts.lock_parents

        def pausing(self: Counts, task_ids: list[str]) -> None:  # the submit's parents shared, then a pause
            lock_parents(self, task_ids)
            if task_ids:
                meeting.pause()

        monkeypatch.setattr(Counts, "lock_parents", pausing)
        (submitted, _), errors = meeting.run(
            lambda: two.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={}, after=[child])),
            lambda: one.store.tasks.transition(parent, TaskState.SUCCEEDED, values={"started_at": time.time()}))
        assert errors == []
        assert one.store.tasks.get(child).state == TaskState.QUEUED
        assert one.store.tasks.get(submitted["task_id"]).state == TaskState.WAITING
    finally:
        for cp in (one, two):
            cp.db.dispose()


def test_waiting_tasks_take_no_place_in_a_queue_and_count_in_flight(home: Path) -> None:
    """A waiting task passes a full queue (it is in no queue), counts against its caller's tasks
    in flight, and once released joins its queue even when the queue is full."""
    from controlplane import api
    from controlplane.errors import ControlPlaneError

    write_catalog(home, queue_length=1)
    cp = ControlPlane(Settings(home=home, limit_tasks_in_flight=3, **FAST))

    def submit_as_alice(after: list[str] | None = None) -> dict[str, Any]:
        return cp.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={}, after=after or []))

    def refused(code: str) -> None:
        with pytest.raises(ControlPlaneError) as e:
            submit_as_alice()
        assert e.value.code == code

    parent = submit_as_alice()["task_id"]  # the queue (length 1) is full now
    child = submit_as_alice([parent])
    assert child["state"] == "waiting"
    refused("QUEUE_OVERLOADED")
    cp.store.tasks.transition(parent, TaskState.SCHEDULED)  # its place in the queue is free
    assert submit_as_alice()["state"] == "queued"  # the queue is full again
    refused("LIMIT_EXCEEDED")  # parent, child (waiting) and that one are 3 in flight
    cp.store.tasks.transition(parent, TaskState.RUNNING)
    cp.store.tasks.transition(parent, TaskState.SUCCEEDED)
    assert cp.store.tasks.get(child["task_id"]).state == TaskState.QUEUED
    assert cp.store.tasks.queue_depths() == {"cpu_small": 2}
