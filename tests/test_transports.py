"""The lifecycle through real MCP clients over real transports: fastmcp's Client and the `mcp`
SDK's Client, over stdio (the server as a subprocess on pipes) and over Streamable HTTP."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.client.stdio import StdioServerParameters

from tests.conftest import ROOT, TERMINAL, ServerProcess, fast_env

pytestmark = pytest.mark.anyio

SERVE_STDIO = ["-m", "controlplane.cli", "serve", "--transport", "stdio"]


async def lifecycle(call: Any) -> None:
    """Submit, follow, tail, collect and download: the same checks whatever the client."""
    sub = await call("submit_task", {"tool_name": "exercise", "inputs": {
        "progress_steps": 4, "sleep_s": 0.4, "log_lines": 50, "artifact_bytes": 4096}})
    tid = sub["task_id"]
    deadline = time.monotonic() + 60
    seen = set()
    while True:
        st = await call("get_task_status", {"task_id": tid})
        seen.add(st["state"])
        if st["state"] in TERMINAL:
            break
        assert time.monotonic() < deadline, st
        await anyio.sleep(0.05)
    assert st["state"] == "succeeded", st
    assert "running" in seen or "scheduled" in seen or "queued" in seen
    page = await call("tail_task_logs", {"task_id": tid, "limit": 20})
    assert [ln["message"] for ln in page["lines"]] == [f"line {i}" for i in range(20)]
    page2 = await call("tail_task_logs", {"task_id": tid, "cursor": page["next_cursor"], "limit": 1000})
    assert [ln["message"] for ln in page2["lines"]] == [f"line {i}" for i in range(20, 50)]
    assert page2["has_more"] is False
    res = await call("get_task_result", {"task_id": tid})
    [art] = res["artifacts"]
    async with httpx.AsyncClient() as http:
        body = (await http.get(art["download_url"])).content
    assert hashlib.sha256(body).hexdigest() == art["sha256"] and len(body) == 4096
    listed = await call("list_tasks", {"states": ["succeeded"]})
    assert tid in [t["task_id"] for t in listed["tasks"]]


def fastmcp_caller(client: Client):
    async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        r = await client.call_tool(tool, args, raise_on_error=False)
        assert not r.is_error, r.content[0].text
        return json.loads(r.content[0].text)
    return call


def sdk_caller(client: mcp.Client):
    async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        r = await client.call_tool(tool, args)
        assert not r.is_error, r.content[0].text
        return json.loads(r.content[0].text)
    return call


async def test_stdio_with_fastmcp_client(home: Path) -> None:
    transport = StdioTransport(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
    async with Client(transport) as client:
        tools = {t.name for t in await client.list_tools()}
        assert {"submit_task", "get_task_status", "tail_task_logs", "list_tasks", "cancel_task",
                "get_task_result", "lj_relax", "exercise"} <= tools
        await lifecycle(fastmcp_caller(client))


async def test_stdio_with_mcp_sdk_client(home: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
    async with mcp.Client(params) as client:
        await lifecycle(sdk_caller(client))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_http_with_fastmcp_client(server_process: ServerProcess, mode: str) -> None:
    server_process.start()
    async with Client(server_process.url, mode=mode) as client:
        await lifecycle(fastmcp_caller(client))


async def test_http_with_mcp_sdk_client(server_process: ServerProcess) -> None:
    server_process.start()
    async with mcp.Client(server_process.url) as client:
        await lifecycle(sdk_caller(client))


async def test_task_survives_client_disconnect_and_reconnect(server_process: ServerProcess) -> None:
    server_process.start()
    async with Client(server_process.url) as client:
        r = await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 1.0}})
        tid = json.loads(r.content[0].text)["task_id"]
    await anyio.sleep(1.5)  # nobody is connected while it runs
    async with Client(server_process.url) as client:
        call = fastmcp_caller(client)
        deadline = time.monotonic() + 30
        while (st := await call("get_task_status", {"task_id": tid}))["state"] not in TERMINAL:
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
        assert st["state"] == "succeeded"
