"""Cancellation and timeouts (seed 003): cancel of queued, running and finished tasks; a
timeout kills the job with TOOL_TIMEOUT and timeoutMs; either way the whole process tree goes,
grandchildren included, and SIGKILL follows SIGTERM when the tool ignores it."""

from __future__ import annotations

import time

import pytest

from tests.conftest import Agent, all_dead, pid_alive, tree_pids

pytestmark = pytest.mark.anyio


async def test_cancel_running_task_kills_grandchildren(agent: Agent, cp) -> None:
    tid = await agent.submit(inputs={"spawn_children": 2, "sleep_s": 120})
    pids = await tree_pids(agent, tid, 2)
    assert len(pids) == 4 and all(pid_alive(p) for p in pids)

    ack = await agent.call("cancel_task", task_id=tid, reason="no longer needed")
    assert ack == {"task_id": tid, "state": "cancel_requested", "acknowledged": True}
    st = await agent.wait(tid, timeout=30)
    assert st["state"] == "cancelled"
    assert st["error"]["code"] == "CANCELLED" and "no longer needed" in st["error"]["message"]
    assert await all_dead(pids), [p for p in pids if pid_alive(p)]

    path = [e.to_state for e in cp.store.logs.events(tid) if e.to_state]
    assert path[-3:] == ["cancel_requested", "cancelling", "cancelled"]
    # the slot is free again: a new task runs
    assert (await agent.wait(await agent.submit(inputs={}), timeout=30))["state"] == "succeeded"


async def test_tool_ignoring_sigterm_is_killed_after_grace(agent: Agent, settings) -> None:
    tid = await agent.submit(inputs={"spawn_children": 1, "sleep_s": 120, "ignore_sigterm": True})
    pids = await tree_pids(agent, tid, 1)
    started = time.monotonic()
    await agent.call("cancel_task", task_id=tid)
    st = await agent.wait(tid, timeout=30)
    assert st["state"] == "cancelled"
    assert await all_dead(pids)
    # it took the SIGKILL escalation, not more than a few grace periods
    assert time.monotonic() - started >= settings.kill_grace_s * 0.9


async def test_timeout_kills_tree_and_reports_tool_timeout(agent: Agent, cp) -> None:
    tid = await agent.submit(inputs={"spawn_children": 2, "sleep_s": 120}, resources={"max_runtime_s": 1})
    pids = await tree_pids(agent, tid, 2)
    st = await agent.wait(tid, timeout=30)
    assert st["state"] == "timed_out"
    assert st["error"]["code"] == "TOOL_TIMEOUT" and st["error"]["timeoutMs"] == 1000
    assert await all_dead(pids)
    path = [e.to_state for e in cp.store.logs.events(tid) if e.to_state]
    assert path == ["queued", "scheduled", "running", "cancelling", "timed_out"]
    res = await agent.call("get_task_result", task_id=tid)
    assert res["state"] == "timed_out" and res["error"]["timeoutMs"] == 1000 and res["result"] is None


async def test_cancel_queued_task_is_immediate(agent: Agent, cp) -> None:
    # cpu_small runs two at a time: two sleepers hold the slots, the third waits
    holders = [await agent.submit(inputs={"sleep_s": 60}) for _ in range(2)]
    for h in holders:
        await agent.wait(h, {"running"})
    queued = await agent.call("submit_task", tool_name="exercise", inputs={})
    assert queued["state"] == "queued" and queued["position"] == 1
    ack = await agent.call("cancel_task", task_id=queued["task_id"])
    assert ack["state"] == "cancelled" and ack["acknowledged"] is True
    st = await agent.call("get_task_status", task_id=queued["task_id"])
    assert st["state"] == "cancelled" and st["started_at"] is None
    assert cp.store.jobs.get(queued["task_id"], 1) is None  # no job was ever launched for it
    for h in holders:
        await agent.call("cancel_task", task_id=h)
    for h in holders:
        assert (await agent.wait(h))["state"] == "cancelled"


async def test_cancel_finished_task_changes_nothing(agent: Agent, cp) -> None:
    tid = await agent.submit(inputs={"result": {"x": 1}})
    assert (await agent.wait(tid))["state"] == "succeeded"
    before = cp.store.logs.events(tid)
    ack = await agent.call("cancel_task", task_id=tid)
    assert ack["state"] == "succeeded" and ack["acknowledged"] is False
    assert cp.store.logs.events(tid) == before
    assert (await agent.call("get_task_result", task_id=tid))["result"]["x"] == 1


async def test_cancel_is_idempotent(agent: Agent) -> None:
    tid = await agent.submit(inputs={"sleep_s": 60})
    await agent.wait(tid, {"running"})
    first = await agent.call("cancel_task", task_id=tid)
    second = await agent.call("cancel_task", task_id=tid)
    assert first["acknowledged"] and second["acknowledged"]
    assert second["state"] in ("cancel_requested", "cancelling", "cancelled")
    assert (await agent.wait(tid))["state"] == "cancelled"
