"""Queues: admission (QUEUE_OVERLOADED when full), priority first then FIFO, one slot per
running task until it finishes, and idempotent submits under concurrency."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.guards import QueueFull, QueueLength
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store import Store, Submitted
from controlplane.store.db import Database
from tests.conftest import FAST, Agent, write_catalog
from tests.test_states import new_task

pytestmark = pytest.mark.anyio


@pytest.fixture
async def one_slot(home: Path):
    """cpu_small with one slot and room for two waiting tasks."""
    write_catalog(home, concurrency=1, queue_length=2)
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        yield cp, Agent(client)


async def test_full_queue_answers_queue_overloaded_and_changes_nothing(one_slot) -> None:
    cp, agent = one_slot
    holder = await agent.submit(inputs={"sleep_s": 60})
    await agent.wait(holder, {"running"})
    waiting = [await agent.submit(inputs={}) for _ in range(2)]
    before = cp.store.tasks.count_by_state()
    err = await agent.error("submit_task", tool_name="exercise", inputs={})
    assert err["code"] == "QUEUE_OVERLOADED" and "cpu_small" in err["message"] and err["hint"]
    err2 = await agent.error("exercise")  # the catalog tool itself is admitted the same way
    assert err2["code"] == "QUEUE_OVERLOADED"
    assert cp.store.tasks.count_by_state() == before
    await agent.call("cancel_task", task_id=waiting[0])
    assert await agent.submit(inputs={})  # room again
    await agent.call("cancel_task", task_id=holder)


async def test_priority_first_then_fifo(home: Path) -> None:
    write_catalog(home, concurrency=1, queue_length=100)
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        holder = await agent.submit(inputs={"sleep_s": 60})
        await agent.wait(holder, {"running"})
        order = [("low-1", 0), ("high-1", 5), ("low-2", 0), ("high-2", 5), ("mid", 1)]
        ids = {}
        for name, prio in order:
            ids[name] = await agent.submit(inputs={"result": {"name": name}}, priority=prio)
        st = await agent.call("get_task_status", task_id=ids["low-1"])
        assert st["state"] == "queued" and st["position"] == 4  # behind high-1, high-2 and mid
        assert (await agent.call("get_task_status", task_id=ids["high-1"]))["position"] == 1
        await agent.call("cancel_task", task_id=holder)
        for tid in ids.values():
            assert (await agent.wait(tid))["state"] == "succeeded"
        started = sorted(ids, key=lambda n: cp.store.tasks.get(ids[n]).started_at)
        assert started == ["high-1", "high-2", "mid", "low-1", "low-2"]


async def test_running_task_holds_exactly_one_slot(agent: Agent, cp: ControlPlane) -> None:
    tids = [await agent.submit(inputs={"sleep_s": 0.6}) for _ in range(6)]
    peak = 0
    while True:
        counts = cp.store.tasks.count_by_state("cpu_small")
        holding = sum(counts.get(s, 0) for s in ("scheduled", "running", "cancel_requested", "cancelling"))
        peak = max(peak, holding)
        assert holding <= 2, counts
        if counts.get("succeeded", 0) == len(tids):
            break
        await anyio.sleep(0.02)
    assert peak == 2


async def test_concurrent_duplicate_submits_make_one_task(agent: Agent, cp: ControlPlane) -> None:
    results: list[dict] = []

    async def submit() -> None:
        results.append(await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 0.1},
                                        idempotency_key="same-key"))

    async with anyio.create_task_group() as tg:
        for _ in range(25):
            tg.start_soon(submit)
    assert len({r["task_id"] for r in results}) == 1
    assert sum(1 for r in results if not r.get("deduplicated")) == 1
    with cp.db.engine.connect() as c:
        assert c.execute(text("select count(*) from tasks")).scalar() == 1
    # the key is scoped by tool: another tool with the same key is another task
    other = await agent.call("submit_task", tool_name="lj_relax", inputs={"n_atoms": 5},
                             idempotency_key="same-key")
    assert other["task_id"] != results[0]["task_id"]


async def test_reused_idempotency_key_with_other_inputs_is_refused(agent: Agent, cp: ControlPlane) -> None:
    first = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 0.1}, idempotency_key="k")
    again = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 0.1}, idempotency_key="k")
    assert again["task_id"] == first["task_id"] and again["deduplicated"] is True
    err = await agent.error("submit_task", tool_name="exercise", inputs={"sleep_s": 9}, idempotency_key="k")
    assert err["code"] == "INVALID_REQUEST" and "different inputs" in err["message"]
    assert first["task_id"] in err["message"]
    with cp.db.engine.connect() as c:
        assert c.execute(text("select count(*) from tasks")).scalar() == 1


def two_processes(home: Path) -> list[Store]:
    """Two stores on the test's database, each with its own engine and connections, as two
    servers would have (the first migrates it)."""
    ControlPlane(Settings(home=home, **FAST)).db.dispose()
    url = Settings(home=home).resolved_database_url
    return [Store(Database(url)) for _ in range(2)]


def at_once(n: int, fn: Callable[[int], object]) -> list[object]:
    """`fn(0..n-1)` from n threads released together; each one's result or exception."""
    out: list[object] = [None] * n
    gate = threading.Barrier(n)

    def run(i: int) -> None:
        gate.wait()
        try:
            out[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - the caller looks at it
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_queue_admits_its_length_and_no_more_whoever_submits(home: Path) -> None:
    """Submits racing from two processes into one queue: admission is serialised per queue, so
    exactly `max_queue_length` get in and the others are refused."""
    stores = two_processes(home)
    outcomes = at_once(16, lambda i: stores[i % 2].tasks.submit(new_task(), [QueueLength(5)]))
    assert sum(isinstance(o, Submitted) for o in outcomes) == 5
    assert all(isinstance(o, Submitted | QueueFull) for o in outcomes), outcomes
    assert stores[0].tasks.count_by_state("cpu_small") == {"queued": 5}


def test_one_key_submitted_at_once_from_two_processes_makes_one_task(home: Path) -> None:
    """Duplicate submits (one idempotency key) racing from two processes: one task, and every
    caller is answered with it (on PostgreSQL the losers' inserts fail on the unique key and read
    the winner's row)."""
    stores = two_processes(home)
    task = dataclasses.replace(new_task(), idempotency_key="same-key")
    outcomes = at_once(16, lambda i: stores[i % 2].tasks.submit(task, [QueueLength(100)]))
    assert all(isinstance(o, Submitted) for o in outcomes), outcomes
    assert len({o.task.task_id for o in outcomes}) == 1  # type: ignore[union-attr]
    assert sum(o.created for o in outcomes) == 1  # type: ignore[union-attr]
    assert stores[1].tasks.count_by_state("cpu_small") == {"queued": 1}


def test_claims_racing_for_the_slots_fill_them_and_no_more(home: Path) -> None:
    """Two schedulers claiming from one queue at once take each task once and never more tasks
    than the class has slots."""
    stores = two_processes(home)
    for _ in range(10):
        stores[0].tasks.submit(new_task(), [QueueLength(100)])
    claims = at_once(8, lambda i: stores[i % 2].jobs.claim_for_launch("cpu_small", capacity=3))
    assert not [c for c in claims if isinstance(c, Exception)], claims
    claimed = [task.task_id for c in claims for task, _job in c]  # type: ignore[union-attr]
    assert len(claimed) == len(set(claimed)) == 3
    assert stores[0].tasks.count_by_state("cpu_small") == {"queued": 7, "scheduled": 3}


def hold_queue(cp: ControlPlane, queue: str) -> Callable[[], None]:
    """Another process's write transaction, holding what a submit into `queue` waits for (on
    SQLite the database's write lock, on PostgreSQL the queue's admission lock); returns its commit."""
    if cp.db.is_sqlite:
        holder = sqlite3.connect(cp.settings.resolved_database_url.split("///", 1)[1], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")

        def commit() -> None:
            holder.execute("COMMIT")
            holder.close()
        return commit
    other = Database(cp.settings.resolved_database_url)
    conn = other.engine.connect()
    conn.begin()
    other.lock(conn, queue)

    def release() -> None:
        conn.commit()
        conn.close()
        other.dispose()
    return release


async def test_submit_waits_for_a_held_write_lock_without_blocking_other_calls(agent: Agent, cp: ControlPlane,
                                                                             settings) -> None:
    """A submit tried on the event loop finds the write lock taken, moves to a worker thread and
    waits there; meanwhile other calls are answered."""
    known = await agent.submit(inputs={})
    release = hold_queue(cp, "cpu_small")  # another process admitting into the same queue
    result: dict = {}

    async def submit() -> None:
        result.update(await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 0.1}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit)
        await anyio.sleep(0.3)
        assert not result  # still waiting for the lock
        st = await agent.call("get_task_status", task_id=known)  # the loop is free
        assert st["task_id"] == known
        release()
    assert result["state"] == "queued"
    assert cp.store.tasks.get(result["task_id"]) is not None


async def test_a_launch_refused_for_good_after_transient_failures_leaves_no_retry_state(home: Path) -> None:
    """A launch that failed transiently (retried with backoff) and then is refused for good ends
    its attempt, and the scheduler keeps nothing for it (no backoff left to grow with time)."""
    from controlplane_providers.base import PermanentProviderError
    from tests.test_states import new_task

    write_catalog(home, concurrency=1, queue_length=10)
    cp = ControlPlane(Settings(home=home, **FAST))
    provider = cp.providers["local"]
    tries: list[str] = []

    def launch(spec: object) -> object:
        tries.append("try")
        if len(tries) == 1:
            raise ConnectionError("the API dropped the connection")
        raise PermanentProviderError("the job definition is gone")

    provider.launch = launch  # type: ignore[method-assign]
    sched = cp.scheduler  # (its loop is not running: the test drives it)
    tid = cp.store.tasks.submit(new_task(), [QueueLength(10)]).task.task_id
    [(_task, job)] = cp.store.jobs.claim_for_launch("cpu_small", 1)
    await sched._launch_guarded(job)
    assert sched._failures and sched._retry_at  # backing off
    await sched._launch_guarded(job)
    assert tries == ["try", "try"]
    assert cp.store.tasks.get(tid).state == "failed"
    assert sched._failures == {} and sched._retry_at == {}


async def test_a_submit_wakes_the_scheduler_from_the_loop_and_from_a_thread(home: Path) -> None:
    """The scheduler looks at its queues every `scheduler_interval_s` (here a minute) and at once
    after each submit: one made on the event loop (a tool call) and one made in a worker thread
    both reach a running job in seconds, not at the next interval."""
    write_catalog(home, concurrency=2)
    cp = ControlPlane(Settings(home=home, **{**FAST, "scheduler_interval_s": 60.0}))
    owner = cp.settings.default_owner
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        await anyio.sleep(0.5)  # past the scheduler's first look, which finds nothing
        on_loop = await agent.submit(inputs={"sleep_s": 30})
        await agent.wait(on_loop, {"running"}, timeout=15)
        req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 30})
        in_thread = (await anyio.to_thread.run_sync(cp.service.submit, owner, req))["task_id"]
        await agent.wait(in_thread, {"running"}, timeout=15)
        for task_id in (on_loop, in_thread):
            await agent.call("cancel_task", task_id=task_id)
            await agent.wait(task_id)


async def test_submits_into_a_full_class_do_not_tick_the_scheduler_and_a_freed_slot_still_does(home: Path) -> None:
    """Every submit used to wake the scheduler, which then read its queues to find no free slot.
    Submits into a class whose slots were all busy at the scheduler's last look now leave it
    asleep, and the task waiting longest still starts within seconds once a slot frees (here the
    scheduler's own interval is a minute)."""
    write_catalog(home, concurrency=1)
    cp = ControlPlane(Settings(home=home, **{**FAST, "scheduler_interval_s": 60.0}))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        await anyio.sleep(0.5)  # past the scheduler's first look, which finds nothing
        holder = await agent.submit(inputs={"sleep_s": 60})
        await agent.wait(holder, {"running"}, timeout=15)
        await anyio.sleep(0.2)
        ticks = cp.scheduler.ticks
        waiting = [await agent.submit(inputs={"sleep_s": 0}) for _ in range(20)]
        await anyio.sleep(0.3)
        assert cp.scheduler.ticks - ticks <= 1  # (one tick may have been on its way)
        assert {cp.store.tasks.get(t).state for t in waiting} == {"queued"}
        await agent.call("cancel_task", task_id=holder)
        await agent.wait(holder)
        await agent.wait(waiting[0], {"running", "succeeded"}, timeout=15)
        for task_id in waiting:
            await agent.call("cancel_task", task_id=task_id)
