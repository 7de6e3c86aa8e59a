"""Queues: admission (QUEUE_OVERLOADED when full), priority first then FIFO, one slot per
running task until it finishes, and idempotent submits under concurrency."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store.db import Database
from tests.conftest import FAST, Agent, write_catalog

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
    other.lock_queue(conn, queue)

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
