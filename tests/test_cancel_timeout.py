"""Cancellation and timeouts (docs/design/errors-and-cancellation.md): cancel of queued, running and finished tasks; a
timeout kills the job with TOOL_TIMEOUT and timeoutMs; either way the whole process tree goes,
grandchildren included, and SIGKILL follows SIGTERM when the tool ignores it. A client that
cancels a wait_task request gets exactly one answer, CANCELLED, no progress after it, and the
task goes on (section 7), on every wire that can carry an answer."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from controlplane.ids import AttemptRef
from tests.conftest import ROOT, TERMINAL, Agent, all_dead, fast_env, pid_alive, tree_pids
from tests.wire import LEGACY, MODERN, Legacy, Stdio, modern_request, sse_events

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
    assert cp.store.jobs.get(AttemptRef(queued["task_id"], 1)) is None  # no job was ever launched for it
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


# ---- cancelling a wait (docs/design/errors-and-cancellation.md) ----------------------------------
WAITED = {"progress_steps": 12, "sleep_s": 4, "result": {"k": "v"}}  # about 3 s left when the wait is cancelled


def progress_for(messages: list[dict[str, Any]], token: str) -> list[int]:
    """Where in `messages` the progress notifications for `token` are."""
    return [i for i, m in enumerate(messages)
            if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_cancelled_wait_over_stdio_answers_cancelled_once_and_the_task_goes_on(home: Path, era: str) -> None:
    async with Stdio(fast_env(home, keepalive_s=0.3), ROOT, era) as rpc:
        tid = (await rpc.call("submit_task", tool_name="exercise", inputs=WAITED))["task_id"]
        wait = rpc.send("tools/call", {"name": "wait_task", "arguments": {"task_id": tid, "timeout_s": 60},
                                       "_meta": {"progressToken": "w"}})
        while len(progress_for(rpc.messages, "w")) < 2:  # the wait is streaming
            await anyio.sleep(0.02)
        # an id echoed as a string still names the request
        rpc.notify("notifications/cancelled", {"requestId": str(wait) if era == LEGACY else wait, "reason": "bored"})
        answer = await rpc.answer(wait, timeout=10)
        assert answer["result"]["isError"] is True, answer
        assert answer["result"]["structuredContent"]["code"] == "CANCELLED"
        assert answer["result"]["structuredContent"]["task_id"] == tid
        assert ("resultType" in answer["result"]) == (era == MODERN)  # shaped for its era
        st = await rpc.call("get_task_status", task_id=tid)
        # waiting was cancelled, not the task (which may still be starting: two progress
        # notifications can be its queued and scheduled states)
        assert st["state"] in ("scheduled", "running"), st
        done = await rpc.call("wait_task", task_id=tid, timeout_s=60)
        assert done["state"] == "succeeded" and done["result"]["k"] == "v"
        await anyio.sleep(0.5)
        assert rpc.answers(wait) == [answer]  # exactly one answer, even once the task is over
        answered_at = rpc.messages.index(answer)
        assert progress_for(rpc.messages, "w") and max(progress_for(rpc.messages, "w")) < answered_at


async def test_a_cancelled_wait_over_legacy_http_answers_cancelled_once_and_the_task_goes_on(http_server: Any) -> None:
    """The 2025-11-25 wire: the answer ends the request's SSE stream; the transport adds no
    'Request cancelled' error after it, neither live nor in a replay from Last-Event-ID."""
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = Legacy(http, http_server.url)
        await rpc.start()
        sub = (await rpc.request("tools/call", {"name": "submit_task", "arguments": {
            "tool_name": "exercise", "inputs": WAITED}}))["result"]["structuredContent"]
        body = rpc.body("tools/call", {"name": "wait_task", "arguments": {"task_id": sub["task_id"], "timeout_s": 60},
                                       "_meta": {"progressToken": "w"}})
        events: list[Any] = []
        async with http.stream("POST", rpc.url, json=body, headers=rpc.headers()) as r:
            async for event in sse_events(r):
                events.append(event)
                if event.data is not None and len([e for e in events if e.data]) == 2:
                    cancelled = await http.post(rpc.url, headers=rpc.headers(), json={
                        "jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": body["id"], "reason": "bored"}})
                    assert cancelled.status_code == 202
        messages = [e.data for e in events if e.data is not None]
        answers = [m for m in messages if m.get("id") == body["id"]]
        assert len(answers) == 1 and messages[-1] is answers[0], messages  # one answer, nothing after it
        assert answers[0]["result"]["isError"] and answers[0]["result"]["structuredContent"]["code"] == "CANCELLED"
        replayed: list[dict[str, Any]] = []  # what a client resuming from the first event would get
        async with http.stream("GET", rpc.url, headers=rpc.headers(**{"Last-Event-ID": events[0].id})) as r:
            with anyio.move_on_after(1.5):
                async for event in sse_events(r):
                    if event.data is not None:
                        replayed.append(event.data)
        assert [m for m in replayed if m.get("id") == body["id"]] == answers, replayed
        st = (await rpc.request("tools/call", {"name": "get_task_status", "arguments": {
            "task_id": sub["task_id"]}}))["result"]["structuredContent"]
        assert st["state"] in ("scheduled", "running"), st  # the wait was cancelled, not the task
        done = (await rpc.request("tools/call", {"name": "wait_task", "arguments": {
            "task_id": sub["task_id"], "timeout_s": 60}}))["result"]["structuredContent"]
        assert done["state"] == "succeeded"


async def test_a_modern_http_wait_has_no_cancelled_answer_and_the_task_goes_on(http_server: Any) -> None:
    """The 2026-07-28 HTTP wire cannot carry a CANCELLED answer: the SDK acknowledges a POSTed
    `notifications/cancelled` and drops it before any handler sees it (the wait goes on and
    answers as usual, once), and the cancellation the protocol defines there, closing the
    response stream, leaves nothing to answer on. Either way the task goes on."""
    async with httpx.AsyncClient(timeout=60) as http:

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            body, headers = modern_request("tools/call", {"name": tool, "arguments": arguments})
            return (await http.post(http_server.url, json=body, headers=headers)).json()["result"]["structuredContent"]

        tid = (await call("submit_task", tool_name="exercise", inputs=WAITED))["task_id"]
        body, headers = modern_request("tools/call", {"name": "wait_task", "arguments": {
            "task_id": tid, "timeout_s": 60}}, request_id=7, meta={"progressToken": "w"})
        messages: list[dict[str, Any]] = []
        async with http.stream("POST", http_server.url, json=body, headers=headers) as r:
            async for event in sse_events(r):
                if event.data is None:
                    continue
                messages.append(event.data)
                if len(messages) == 2:
                    note, note_headers = modern_request("notifications/cancelled", {"requestId": 7})
                    del note["id"]
                    assert (await http.post(http_server.url, json=note, headers=note_headers)).status_code == 202
        [answer] = [m for m in messages if m.get("id") == 7]
        assert answer["result"]["structuredContent"]["state"] == "succeeded" and messages[-1] is answer

        tid = (await call("submit_task", tool_name="exercise", inputs=WAITED))["task_id"]
        body, headers = modern_request("tools/call", {"name": "wait_task", "arguments": {
            "task_id": tid, "timeout_s": 60}}, request_id=8, meta={"progressToken": "w2"})
        async with http.stream("POST", http_server.url, json=body, headers=headers) as r:
            async for event in sse_events(r):
                if event.data is not None:
                    break  # the client closes the stream: the cancellation of this wire
        assert (await call("get_task_status", task_id=tid))["state"] in ("queued", "scheduled", "running")
        assert (await call("wait_task", task_id=tid, timeout_s=60))["state"] == "succeeded"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_sdk_client_that_gives_up_a_wait_over_stdio_carries_on(home: Path, mode: str) -> None:
    """A real client abandons a wait (it sends `notifications/cancelled` itself and drops the late
    CANCELLED answer, as MCP tells it to): its session stays usable and the task goes on."""
    transport = StdioTransport(command=sys.executable, args=["-m", "controlplane.cli", "serve", "--transport", "stdio"],
                               env=fast_env(home, keepalive_s=0.3), cwd=str(ROOT))
    got: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got.append(progress)

    async with Client(transport, mode=mode) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs=WAITED)
        with anyio.move_on_after(1.0):
            await client.call_tool("wait_task", {"task_id": tid, "timeout_s": 60}, progress_handler=on_progress)
        assert got, "no progress before the client gave up"
        assert (await agent.call("get_task_status", task_id=tid))["state"] == "running"
        out = await agent.call("wait_task", task_id=tid, timeout_s=60)
        assert out["state"] == "succeeded" and out["state"] in TERMINAL
