"""A sweep as one native MCP task (docs/design/sweeps.md): a catalog tool called with the sweep
`_meta` is one task, its status message the sweep's aggregate and its result the sweep's; it
cancels as one; bad input is refused before any shard exists; `tasks/list` lists it as one task,
on one page, and none of its shards. Through fastmcp's Client with the
tasks extension (2026-07-28, in memory and over HTTP), raw 2025-11-25 JSON-RPC over HTTP, and the
mcp SDK's client over stdio to `controlplane serve`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp_types
import pytest
from fastmcp_tasks import call_tool_task
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.mcp.sweep_tasks import SWEEP_META
from tests.conftest import ROOT, Agent, ServerProcess, fast_env, serving
from tests.test_native_tasks import poll_until, tasks_client, tasks_get, tasks_list
from tests.test_streaming import SERVE_STDIO
from tests.wire import Legacy

pytestmark = pytest.mark.anyio

SHARDS = 20
VARY = {"list": [{"result": {"i": i}} for i in range(SHARDS)]}
BASE = {"progress_steps": 4, "sleep_s": 0.4}


@asynccontextmanager
async def target_of(cp: ControlPlane, over: str) -> AsyncIterator[Any]:
    """What a client connects to: the server in memory, or its URL over HTTP."""
    if over == "http":
        async with serving(cp) as server:
            yield server.url
    else:
        yield build_server(cp)


@pytest.mark.parametrize("over", ["memory", "http"])
async def test_a_sweep_call_is_one_task_with_the_aggregate_and_the_sweeps_result(cp: ControlPlane,
                                                                                  over: str) -> None:
    async with target_of(cp, over) as target, tasks_client(target) as client:
        handle = await call_tool_task(client, "exercise", BASE, meta={SWEEP_META: {"vary": VARY,
                                                                                    "max_parallel": 4}})
        created = handle.create_result
        sid = created.task_id
        assert sid.startswith("swp_") and created.status == "working"
        assert created.ttl_ms == cp.settings.default_ttl_s * 1000 and created.poll_interval_ms >= 1000
        st = await Agent(client).call("get_sweep_status", sweep_id=sid)  # committed before the answer
        assert st["shards"] == SHARDS and st["max_parallel"] == 4
        deadline = time.monotonic() + 60
        while True:  # the status message is the aggregate
            got = await tasks_get(client, sid)
            if got.status_message and "running" in got.status_message:
                break
            assert time.monotonic() < deadline, got
            await anyio.sleep(0.05)
        assert got.status == "working" and f"/{SHARDS} shards ended" in got.status_message
        done = await poll_until(client, sid, {"completed", "failed", "cancelled"}, timeout=120)
        assert done.status == "completed" and done.status_message.startswith(f"100% {SHARDS}/{SHARDS}")
        res = done.result
        assert res is not None and res["isError"] is False
        out = res["structuredContent"]
        assert out["status"]["counts"] == {"succeeded": SHARDS} and out["next_cursor"] is None
        assert [r["result"]["i"] for r in out["results"]] == list(range(SHARDS))
        assert json.loads(res["content"][0]["text"]) == out
        assert (await handle.result()).structured_content["sweep_id"] == sid


async def test_a_sweep_task_with_a_failed_shard_cancels_and_refuses_as_one(cp: ControlPlane) -> None:
    async with tasks_client(build_server(cp)) as client:
        failing = await call_tool_task(client, "exercise", {}, meta={SWEEP_META: {
            "vary": {"list": [{"result": {"ok": 1}}, {"exit_code": 3}]}}})
        got = await poll_until(client, failing.task_id, {"completed", "failed", "cancelled"}, timeout=60)
        assert got.status == "completed" and got.result["isError"] is True  # the results say which failed
        out = got.result["structuredContent"]
        assert [r["state"] for r in out["results"]] == ["succeeded", "failed"]
        assert out["status"]["failures"][0]["shard"] == 1

        slow = await call_tool_task(client, "exercise", {"sleep_s": 60}, meta={SWEEP_META: {"vary": {
            "grid": {"result": [{"a": 1}, {"a": 2}, {"a": 3}]}}}})
        await slow.cancel()
        got = await poll_until(client, slow.task_id, {"completed", "failed", "cancelled"}, timeout=60)
        assert got.status == "cancelled" and "tasks/cancel" in got.status_message
        assert (await Agent(client).call("get_sweep_status", sweep_id=slow.task_id))["counts"] == {"cancelled": 3}

        before = sum(cp.store.tasks.count_by_state().values())
        for meta in ({"vary": {"list": [{"sleep_s": 0}, {"sleep_s": "x"}]}}, {"tool_name": "exercise"}, "grid"):
            res = await client.call_tool("exercise", {}, meta={SWEEP_META: meta}, raise_on_error=False)
            assert res.is_error and json.loads(res.content[0].text)["code"] == "INVALID_REQUEST", meta
        assert sum(cp.store.tasks.count_by_state().values()) == before


async def test_tasks_list_shows_a_sweep_as_one_task_and_none_of_its_shards(cp: ControlPlane) -> None:
    """Its shards were never MCP tasks of the caller's: 60 of them (over a page of 50) still list
    as one entry between the tasks submitted before and after, in both eras."""
    async with serving(cp) as server, tasks_client(server.url) as client, httpx.AsyncClient() as http:
        agent = Agent(client)
        before = await agent.submit("exercise", inputs={"sleep_s": 0})
        handle = await call_tool_task(client, "exercise", {"sleep_s": 0}, meta={SWEEP_META: {
            "vary": {"list": [{"result": {"i": i}} for i in range(60)]}, "max_parallel": 2}})
        sid = handle.task_id
        after = await agent.submit("exercise", inputs={"sleep_s": 0})
        shard_ids = {t["task_id"] for t in (await agent.call("list_tasks", sweep=sid, limit=100))["tasks"]}
        assert len(shard_ids) == 60

        listed: list[dict[str, Any]] = []
        cursor = None
        for _ in range(10):
            page = await tasks_list(client, cursor)
            listed += page["tasks"]
            cursor = page.get("nextCursor")
            if cursor is None:
                break
        assert [t["taskId"] for t in listed] == [after, sid, before]  # newest first, the sweep once
        entry = listed[1]
        assert entry["status"] in ("working", "completed") and "/60 shards ended" in entry["statusMessage"]
        assert {"ttlMs", "pollIntervalMs", "createdAt"} <= set(entry)

        rpc = Legacy(http, server.url)
        await rpc.start()
        legacy = (await rpc.request("tasks/list"))["result"]
        assert [t["taskId"] for t in legacy["tasks"]] == [after, sid, before] and "nextCursor" not in legacy
        assert {"ttl", "pollInterval"} <= set(legacy["tasks"][1]) and "ttlMs" not in legacy["tasks"][1]
        assert not shard_ids & {t["taskId"] for t in listed + legacy["tasks"]}
        await poll_until(client, sid, {"completed"}, timeout=120)


TOKENS = "tok-alice=alice,tok-bob=bob"


async def test_legacy_era_a_sweep_call_answers_the_sweep_and_tasks_methods_follow_it(
        server_process: ServerProcess, home: Any) -> None:
    server_process.env = fast_env(home, auth_tokens=TOKENS)
    server = server_process.start()
    async with httpx.AsyncClient() as http:
        rpc, other = Legacy(http, server.url, "tok-alice"), Legacy(http, server.url, "tok-bob")
        await rpc.start()
        await other.start()
        call = await rpc.request("tools/call", {"name": "exercise", "arguments": BASE,
                                                "_meta": {SWEEP_META: {"vary": VARY}}})
        answer = call["result"]["structuredContent"]  # submit_sweep's answer
        sid = answer["sweep_id"]
        assert sid.startswith("swp_") and answer["shards"] == SHARDS
        got = (await rpc.request("tasks/get", {"taskId": sid}))["result"]
        assert got["taskId"] == sid and got["status"] == "working" and "shards ended" in got["statusMessage"]
        assert {"ttl", "pollInterval", "createdAt", "lastUpdatedAt"} <= set(got) and "result" not in got
        theirs = await other.request("tasks/get", {"taskId": sid})
        assert theirs["error"]["code"] == mcp_types.INVALID_PARAMS and "not found" in theirs["error"]["message"]
        res = (await rpc.request("tasks/result", {"taskId": sid}))["result"]  # waits for every shard
        assert res["isError"] is False and len(res["structuredContent"]["results"]) == SHARDS
        assert (await rpc.request("tasks/get", {"taskId": sid}))["result"]["status"] == "completed"


async def test_the_mcp_sdk_client_over_stdio_submits_a_sweep_and_waits_for_it(home: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    params = StdioServerParameters(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    with anyio.fail_after(120):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            res = await client.call_tool("exercise", {"sleep_s": 0.3}, meta={SWEEP_META: {  # type: ignore[arg-type]
                "vary": {"grid": {"result": [{"a": 1}, {"a": 2}], "progress_steps": [2, 3]}}}})
            sid = res.structuredContent["sweep_id"]  # type: ignore[union-attr]
            waited = await client.call_tool("wait_sweep", {"sweep_id": sid, "timeout_s": 60},
                                            progress_callback=progress)
            out = waited.structuredContent  # type: ignore[union-attr]
            assert out["done"] is True and out["status"]["counts"] == {"succeeded": 4}
    assert seen and all(b > a for a, b in zip(seen, seen[1:], strict=False))
