"""Native MCP tasks (`io.modelcontextprotocol/tasks`, protocol 2026-07-28) served from our store.

Driven by fastmcp's Client with the tasks client extension (`fastmcp_tasks`), in memory and over
HTTP, and by raw JSON-RPC where the wire shape matters (the 2025-11-25 era's `tasks/*`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client import TasksClientExtension
from fastmcp_tasks.client_models import CancelTaskRequest, ClientGetTaskResult, GetTaskRequest, GetTaskRequestParams
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.mcp.tasks import STATUS
from controlplane.settings import Settings
from controlplane.states import TaskState
from tests.conftest import FAST, Agent, ServerProcess, all_dead, fast_env, pid_alive, tree_pids
from tests.wire import Legacy

pytestmark = pytest.mark.anyio


def tasks_client(target: Any, **kw: Any) -> Client:
    """A client that speaks the tasks extension (what `import fastmcp_tasks` gives every client)."""
    return Client(target, extensions=[TasksClientExtension()], **kw)


class ListParams(mcp_types.RequestParams):
    cursor: str | None = None


class ListTasksRequest(mcp_types.Request[ListParams, Literal["tasks/list"]]):
    method: Literal["tasks/list"] = "tasks/list"
    params: ListParams


class AnyResult(mcp_types.Result):
    model_config = ConfigDict(extra="allow")


async def tasks_get(client: Client, task_id: str) -> ClientGetTaskResult:
    return await client.session.send_request(
        GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), ClientGetTaskResult)


async def tasks_list(client: Client, cursor: str | None = None) -> dict[str, Any]:
    res = await client.session.send_request(ListTasksRequest(params=ListParams(cursor=cursor)), AnyResult)
    return res.model_dump(by_alias=True, exclude_none=True)


async def poll_until(client: Client, task_id: str, statuses: set[str], timeout: float = 60) -> ClientGetTaskResult:
    deadline = time.monotonic() + timeout
    while True:
        got = await tasks_get(client, task_id)
        if got.status in statuses:
            return got
        assert time.monotonic() < deadline, got
        await anyio.sleep(0.05)


# ---- the state table -------------------------------------------------------------------------------
def test_every_state_maps_to_one_protocol_status() -> None:
    assert set(STATUS) == set(TaskState)
    assert {s: STATUS[s] for s in TaskState} == {
        TaskState.WAITING: "working", TaskState.QUEUED: "working", TaskState.SCHEDULED: "working",
        TaskState.RUNNING: "working", TaskState.CANCEL_REQUESTED: "working", TaskState.CANCELLING: "working",
        TaskState.SUCCEEDED: "completed", TaskState.FAILED: "failed", TaskState.TIMED_OUT: "failed",
        TaskState.CANCELLED: "cancelled", TaskState.EXPIRED: "failed"}


# ---- creation, polling, result ---------------------------------------------------------------------
async def test_a_catalog_tool_answers_with_a_committed_task(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        handle = await call_tool_task(client, "exercise", {"progress_steps": 4, "sleep_s": 0.6,
                                                           "result": {"answer": 42}})
        created = handle.create_result
        assert created.task_id.startswith("tsk_") and created.status == "working"
        assert created.created_at.endswith("Z") and created.last_updated_at.endswith("Z")
        assert created.ttl_ms == cp.settings.default_ttl_s * 1000
        assert 500 <= created.poll_interval_ms <= 30_000
        # committed before the answer: the canonical tools see it at once
        st = await Agent(client).call("get_task_status", task_id=created.task_id)
        assert st["tool_name"] == "exercise"

        running = await poll_until(client, created.task_id, {"working"})
        assert running.result is None and running.error is None
        done = await handle.wait(timeout=60)
        assert done.status == "completed"
        final = await tasks_get(client, created.task_id)
        assert final.result is not None and final.result["isError"] is False
        assert final.result["structuredContent"]["result"]["answer"] == 42
        assert final.result["structuredContent"]["state"] == "succeeded"
        # the result through the handle is the tool result a synchronous call would give
        res = await handle.result()
        assert res.structured_content["result"]["answer"] == 42


async def test_status_message_carries_the_latest_progress(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        handle = await call_tool_task(client, "exercise", {"progress_steps": 40, "sleep_s": 8})
        deadline = time.monotonic() + 30
        while True:
            got = await tasks_get(client, handle.task_id)
            if got.status_message and "step" in got.status_message:
                break
            assert time.monotonic() < deadline, got
            await anyio.sleep(0.1)
        assert got.status == "working"
        assert "%" in got.status_message and "/40" in got.status_message
        await handle.cancel()


async def test_transparent_call_polls_to_the_result(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        res = await client.call_tool("exercise", {"sleep_s": 0.3, "result": {"x": 1}})
        assert res.structured_content["result"]["x"] == 1
        assert res.meta["duration"] >= 300  # the result says how long the tool ran (ms)
        [task] = (await Agent(client).call("list_tasks"))["tasks"]
        assert task["state"] == "succeeded"


async def test_a_failed_task_is_failed_with_our_error(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        handle = await call_tool_task(client, "exercise", {"exit_code": 3})
        got = await poll_until(client, handle.task_id, {"completed", "failed", "cancelled"})
        assert got.status == "failed" and got.result is None
        assert got.error["data"]["code"] == "TOOL_FAILED"
        assert "3" in got.error["message"]
        with pytest.raises(ToolError, match="exit"):
            await client.call_tool("exercise", {"exit_code": 3})


async def test_bad_arguments_are_refused_before_any_task_exists(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        res = await client.call_tool("exercise", {"sleep_s": "long"}, raise_on_error=False)
        assert res.is_error and json.loads(res.content[0].text)["code"] == "INVALID_REQUEST"
        assert (await tasks_list(client))["tasks"] == []


async def test_cancel_stops_the_process_tree(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        handle = await call_tool_task(client, "exercise", {"sleep_s": 120, "progress_steps": 120,
                                                           "spawn_children": 2})
        agent = Agent(client)
        pids = await tree_pids(agent, handle.task_id, 2)
        assert all(pid_alive(p) for p in pids)
        await handle.cancel()  # an acknowledgement; the task ends cancelled soon after
        got = await poll_until(client, handle.task_id, {"cancelled", "completed", "failed"})
        assert got.status == "cancelled"
        st = await agent.call("get_task_status", task_id=handle.task_id)
        assert st["state"] == "cancelled" and st["error"]["code"] == "CANCELLED"
        assert await all_dead(pids), "the tool's processes outlived tasks/cancel"


async def test_poll_interval_follows_the_estimate_and_ttl_the_setting(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, default_ttl_s=3600, **FAST))
    async with tasks_client(build_server(cp)) as client:
        short = await call_tool_task(client, "exercise", {"sleep_s": 0.1})
        long = await call_tool_task(client, "lj_relax", {"n_atoms": 8, "max_steps": 10})
        assert short.create_result.ttl_ms == 3600 * 1000
        assert short.create_result.poll_interval_ms == 500  # 1 s estimate: the floor
        assert long.create_result.poll_interval_ms == 800  # 8 s estimate: a tenth of it
        done = await poll_until(client, short.task_id, {"completed"})
        # ended: kept for the ttl from its end, and that is what ttlMs says
        assert done.ttl_ms >= 3600 * 1000
        task = cp.store.tasks.get(short.task_id)
        assert done.ttl_ms == int((task.expires_at - task.submitted_at) * 1000)
        await poll_until(client, long.task_id, {"completed", "failed"})


async def test_a_client_without_the_extension_gets_the_two_stage_answer(cp: ControlPlane) -> None:
    server = build_server(cp)
    async with Client(server) as plain, tasks_client(server) as tasked:
        res = await plain.call_tool("exercise", {"sleep_s": 0.1})
        sub = res.structured_content
        assert sub["state"] == "queued" and sub["task_id"].startswith("tsk_")
        with pytest.raises(MCPError) as e:
            await tasks_get(plain, sub["task_id"])
        assert e.value.error.code == mcp_types.jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY
        # the same task is a native task for a client that speaks the extension
        assert (await poll_until(tasked, sub["task_id"], {"completed"})).result is not None


async def test_unknown_ids_are_invalid_params(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        with pytest.raises(MCPError) as e:
            await tasks_get(client, "tsk_" + "a" * 26)
        assert e.value.error.code == mcp_types.INVALID_PARAMS
        assert "not found" in e.value.error.message


async def test_tasks_list_pages_with_a_cursor(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        ids = [(await call_tool_task(client, "exercise", {"sleep_s": 0.01})).task_id for _ in range(3)]
        ids += [(await Agent(client).submit(inputs={"sleep_s": 0.01})) for _ in range(52)]
        seen: list[str] = []
        page = await tasks_list(client)
        while True:
            for t in page["tasks"]:
                assert set(t) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}
            seen += [t["taskId"] for t in page["tasks"]]
            if "nextCursor" not in page:
                break
            page = await tasks_list(client, page["nextCursor"])
        assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)) == 55
        with pytest.raises(MCPError) as e:
            await tasks_list(client, "not-a-cursor")
        assert e.value.error.code == mcp_types.INVALID_PARAMS


# ---- over HTTP: callers, fresh sessions, restarts --------------------------------------------------
async def test_over_http_tasks_are_scoped_by_caller(server_process: ServerProcess, home: Path) -> None:
    server_process.env = fast_env(home, auth_tokens="tok-alice=alice,tok-bob=bob")
    server = server_process.start()
    async with tasks_client(server.url, auth="tok-alice") as alice, tasks_client(server.url, auth="tok-bob") as bob:
        mine = await call_tool_task(alice, "exercise", {"sleep_s": 0.2})
        assert [t["taskId"] for t in (await tasks_list(alice))["tasks"]] == [mine.task_id]
        assert (await tasks_list(bob))["tasks"] == []
        for request in (GetTaskRequest(params=GetTaskRequestParams(task_id=mine.task_id)),
                        CancelTaskRequest(params=GetTaskRequestParams(task_id=mine.task_id))):
            with pytest.raises(MCPError) as e:
                await bob.session.send_request(request, AnyResult)
            assert e.value.error.code == mcp_types.INVALID_PARAMS  # like an unknown id
        assert (await poll_until(alice, mine.task_id, {"completed"})).result is not None


async def test_a_fresh_session_after_a_restart_polls_the_task_by_id(server_process: ServerProcess) -> None:
    server = server_process.start()
    async with tasks_client(server.url) as client:
        handle = await call_tool_task(client, "exercise", {"sleep_s": 3, "progress_steps": 3,
                                                           "result": {"survived": True}})
    server.kill()  # SIGKILL while the task runs
    server.start()
    async with tasks_client(server.url) as fresh:
        got = await poll_until(fresh, handle.task_id, {"completed", "failed", "cancelled"}, timeout=90)
        assert got.status == "completed", got
        assert got.result["structuredContent"]["result"]["survived"] is True


# ---- the 2025-11-25 era: the same tasks, in that era's shapes --------------------------------------
async def test_legacy_era_tasks_methods_in_their_own_shapes(server_process: ServerProcess) -> None:
    server = server_process.start()
    async with httpx.AsyncClient() as http:
        rpc = Legacy(http, server.url)
        await rpc.start()
        call = await rpc.request("tools/call", {"name": "exercise", "arguments": {"sleep_s": 0.5, "result": {"y": 2}}})
        sub = call["result"]["structuredContent"]  # the two-stage answer
        assert sub["state"] == "queued"
        got = (await rpc.request("tasks/get", {"taskId": sub["task_id"]}))["result"]
        assert got["taskId"] == sub["task_id"] and got["status"] == "working"
        assert {"ttl", "pollInterval", "createdAt", "lastUpdatedAt"} <= set(got)
        assert "ttlMs" not in got and "result" not in got
        # tasks/result waits for the end, then answers with the tool result
        res = (await rpc.request("tasks/result", {"taskId": sub["task_id"]}))["result"]
        assert res["isError"] is False and res["structuredContent"]["result"]["y"] == 2
        listed = (await rpc.request("tasks/list"))["result"]
        assert [t["taskId"] for t in listed["tasks"]] == [sub["task_id"]]
        assert listed["tasks"][0]["status"] == "completed"
        missing = await rpc.request("tasks/get", {"taskId": "tsk_" + "b" * 26})
        assert missing["error"]["code"] == mcp_types.INVALID_PARAMS
        # a failed task: tasks/result is the JSON-RPC error carrying our task error
        failing = (await rpc.request("tools/call", {
            "name": "exercise", "arguments": {"exit_code": 2}}))["result"]["structuredContent"]
        err = (await rpc.request("tasks/result", {"taskId": failing["task_id"]}))["error"]
        assert err["data"]["code"] == "TOOL_FAILED"
        cancel_me = (await rpc.request("tools/call", {"name": "exercise", "arguments": {"sleep_s": 60}}
                                       ))["result"]["structuredContent"]
        ack = (await rpc.request("tasks/cancel", {"taskId": cancel_me["task_id"]}))["result"]
        assert ack["taskId"] == cancel_me["task_id"] and ack["status"] in ("working", "cancelled")
        deadline = time.monotonic() + 30
        while (await rpc.request("tasks/get", {"taskId": cancel_me["task_id"]}))["result"]["status"] != "cancelled":
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
