"""Every tool (the canonical tools, wait_task and the catalog's) publishes an outputSchema made from
its answer models, and every answer it gives validates against it: through the `mcp` SDK's client
(which itself checks a tool's structuredContent against its outputSchema) and fastmcp's Client,
over stdio and Streamable HTTP, in both protocol eras, a catalog tool's also when it runs as a
task of the tasks extension. Error results stay isError with a documented code, are not held to
the schema, and leak nothing; an answer that breaks its schema is refused by the SDK's client."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from fastmcp_tasks.client import TasksClientExtension
from jsonschema import Draft202012Validator
from mcp.client.stdio import StdioServerParameters
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from controlplane.app import ControlPlane
from controlplane.errors import ErrorCode
from controlplane.mcp.server import build_server
from tests.conftest import ROOT, TERMINAL, ServerProcess, fast_env
from tests.test_compat import served

pytestmark = pytest.mark.anyio

SERVE_STDIO = ["-m", "controlplane.cli", "serve", "--transport", "stdio"]
ANSWERING = {"submit_task", "get_task_status", "tail_task_logs", "list_tasks", "cancel_task", "get_task_result",
             "usage_report", "wait_task", "exercise", "lj_relax"}
UNKNOWN_ID = "tsk_" + "a" * 26
Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Checked:
    """Calls tools through a real client and holds each answer to the tool's published schema
    (on top of whatever the client itself checks)."""

    def __init__(self, call: Call, tools: list[Any]):
        self._call = call
        self.schemas = {t.name: t.output_schema for t in tools}
        self.shapes: set[str] = set()  # which branch of a union answer was seen

    async def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        res = await self._call(tool, args)
        assert not res.is_error, res.content[0].text
        data = res.structured_content
        assert data == json.loads(res.content[0].text)
        Draft202012Validator(self.schemas[tool]).validate(data)
        for i, shape in enumerate(self.schemas[tool].get("anyOf", [])):
            if Draft202012Validator(shape).is_valid(data):
                self.shapes.add(f"{tool}[{i}]")
        return data

    async def refused(self, tool: str, code: ErrorCode, **args: Any) -> dict[str, Any]:
        res = await self._call(tool, args)
        assert res.is_error
        data = json.loads(res.content[0].text)
        assert data["code"] == code and set(data) <= {"code", "message", "hint"}, data
        assert not Draft202012Validator(self.schemas.get(tool) or {"type": "string"}).is_valid(data)
        for leak in ("Traceback", str(ROOT), "File \"", ".py"):
            assert leak not in res.content[0].text, res.content[0].text
        return data


async def every_tool_answers_to_its_schema(call: Call, tools: list[Any]) -> None:
    """Each tool publishes a valid object-rooted outputSchema; every success answer of
    each, in the states a task passes through, validates against it; errors are isError."""
    published = {t.name: t for t in tools}
    for name in ANSWERING:
        schema = published[name].output_schema
        assert schema is not None, f"{name} publishes no outputSchema"
        assert schema["type"] == "object" and "$ref" not in json.dumps(schema), name
        Draft202012Validator.check_schema(schema)
    assert {b["properties"].get("source", {}).get("const") for b in published["tail_task_logs"].output_schema["anyOf"]} \
        == {None, "provider"}  # the two shapes of a log page, said as two
    assert [b["properties"]["done"]["const"] for b in published["wait_task"].output_schema["anyOf"]] == [True, False]
    # a catalog tool: the task it queued (with a message), or, run as a task, the task's result;
    # called with a sweep: the sweep it queued, or, run as a task, the sweep's first page of results
    assert [("task_id" in b["required"], {"queue", "message"} <= set(b["required"]))
            for b in published["exercise"].output_schema["anyOf"]] == [(True, True), (True, False), (False, True),
                                                                       (False, False)]
    c = Checked(call, tools)
    inputs = {"log_lines": 3, "artifact_bytes": 100, "result": {"x": 1}}
    done = await c.ok("submit_task", tool_name="exercise", inputs=inputs, idempotency_key="k", tags=["a"])
    again = await c.ok("submit_task", tool_name="exercise", inputs=inputs, idempotency_key="k", tags=["a"])
    assert again["deduplicated"] is True
    long = await c.ok("submit_task", tool_name="exercise", inputs={"sleep_s": 60})
    pending = await c.ok("get_task_result", task_id=long["task_id"])
    assert "poll_after_ms" in pending and pending["result"] is None
    states = set()
    deadline = time.monotonic() + 60
    while (st := await c.ok("get_task_status", task_id=done["task_id"]))["state"] not in TERMINAL:
        states.add(st["state"])
        assert time.monotonic() < deadline, st
        await anyio.sleep(0.05)
    assert st["state"] == "succeeded", st
    res = await c.ok("get_task_result", task_id=done["task_id"])
    assert res["result"]["x"] == 1 and res["artifacts"]
    waited = await c.ok("wait_task", task_id=done["task_id"], timeout_s=5)
    assert waited["done"] is True and waited["state"] == "succeeded" and waited["result"] == res["result"]
    running = await c.ok("wait_task", task_id=long["task_id"], timeout_s=0.2)
    assert running["done"] is False and running["status"]["task_id"] == long["task_id"] and running["message"]
    assert c.shapes >= {"wait_task[0]", "wait_task[1]"}
    queued = await c.ok("exercise", result={"y": 2})
    assert queued["task_id"].startswith("tsk_") and "get_task_status" in queued["message"]
    assert "exercise[0]" in c.shapes
    assert (await c.ok("tail_task_logs", task_id=done["task_id"]))["lines"]
    await c.ok("tail_task_logs", task_id=done["task_id"], source="provider")
    assert c.shapes >= {"tail_task_logs[0]", "tail_task_logs[1]"}
    listed = await c.ok("list_tasks", limit=1)
    await c.ok("list_tasks", cursor=listed["next_cursor"])
    assert (await c.ok("cancel_task", task_id=long["task_id"]))["acknowledged"] is True
    assert (await c.ok("cancel_task", task_id=done["task_id"]))["acknowledged"] is False
    await c.ok("usage_report")
    await c.ok("usage_report", group_by=["tag"])
    await c.refused("get_task_status", ErrorCode.NOT_FOUND, task_id=UNKNOWN_ID)
    await c.refused("get_task_result", ErrorCode.NOT_FOUND, task_id=UNKNOWN_ID)
    await c.refused("submit_task", ErrorCode.INVALID_REQUEST, tool_name="exercise", surprise=1)
    await c.refused("tail_task_logs", ErrorCode.INVALID_REQUEST, task_id=done["task_id"], cursor="not a cursor")
    await c.refused("wait_task", ErrorCode.NOT_FOUND, task_id=UNKNOWN_ID)
    await c.refused("exercise", ErrorCode.INVALID_REQUEST, surprise=1)


async def with_sdk_client(server: Any, era: str) -> None:
    async with mcp.Client(server, mode=era) as client:
        assert (client.session.protocol_version in MODERN_PROTOCOL_VERSIONS) == (era == "auto")
        tools = (await client.list_tools()).tools
        await every_tool_answers_to_its_schema(lambda name, args: client.call_tool(name, args), tools)


async def with_fastmcp_client(server: Any, era: str) -> None:
    async with Client(server, mode=era) as client:
        assert (client.session.protocol_version in MODERN_PROTOCOL_VERSIONS) == (era == "auto")
        tools = await client.list_tools()

        async def call(name: str, args: dict[str, Any]) -> Any:
            res = await client.call_tool(name, args, raise_on_error=False)
            assert res.is_error or res.data is not None, name  # the client read the answer through the schema
            return res

        await every_tool_answers_to_its_schema(call, tools)


@pytest.mark.parametrize("era", ["auto", "legacy"])
async def test_over_stdio(home: Any, era: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
    await with_sdk_client(params, era)
    transport = StdioTransport(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
    await with_fastmcp_client(transport, era)


@pytest.mark.parametrize("era", ["auto", "legacy"])
async def test_over_http(server_process: ServerProcess, era: str) -> None:
    server_process.start()
    await with_sdk_client(server_process.url, era)
    await with_fastmcp_client(server_process.url, era)


async def test_a_catalog_tool_run_as_a_task_answers_to_its_schema(server_process: ServerProcess) -> None:
    """Run as a task of the tasks extension (2026-07-28), a catalog tool's result is the task's:
    both clients check it against the tool's outputSchema once the task is done."""
    server_process.start()
    async with mcp.Client(server_process.url, extensions=[TasksClientExtension()]) as client:
        schema = next(t for t in (await client.list_tools()).tools if t.name == "exercise").output_schema
        res = await client.call_tool("exercise", {"result": {"z": 3}})  # the SDK client checks it
        assert not res.is_error and res.structured_content["result"]["z"] == 3
        assert res.structured_content["state"] == "succeeded" and "queue" not in res.structured_content
        Draft202012Validator(schema).validate(res.structured_content)
    async with Client(server_process.url, extensions=[TasksClientExtension()]) as fast:
        got = await fast.call_tool("exercise", {"result": {"z": 4}})
        assert got.structured_content["result"]["z"] == 4 and got.data is not None


@pytest.mark.parametrize("era", ["auto", "legacy"])
async def test_an_answer_that_breaks_its_schema_is_refused_by_the_sdk_client(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, era: str) -> None:
    """A status, a wait's answer and a catalog tool's answer whose state is not one a task can be
    in: the SDK's client refuses each."""
    real, real_wait, real_direct = cp.service.status, cp.service.waited, cp.service.submit_direct

    def broken(owner: str, req: Any) -> dict[str, Any]:
        return {**real(owner, req), "state": "paused"}

    def broken_wait(owner: str, task: Any, timeout_s: float) -> dict[str, Any]:
        out = real_wait(owner, task, timeout_s)
        return {**out, "status": {**out["status"], "state": "paused"}} if "status" in out else {**out, "state": "paused"}

    async def broken_direct(owner: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {**await real_direct(owner, tool_name, arguments), "state": "paused"}

    monkeypatch.setattr(cp.service, "status", broken)
    monkeypatch.setattr(cp.service, "waited", broken_wait)
    monkeypatch.setattr(cp.service, "submit_direct", broken_direct)
    async with served(build_server(cp, with_auth=False).http_app(path="/mcp")) as url, \
            mcp.Client(url, mode=era) as client:
        sub = await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})
        assert not sub.is_error
        with pytest.raises(RuntimeError, match="Invalid structured content returned by tool get_task_status"):
            await client.call_tool("get_task_status", {"task_id": sub.structured_content["task_id"]})
        long = await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 60}})
        for task_id, timeout_s in ((long.structured_content["task_id"], 0.1),  # not done yet
                                   (sub.structured_content["task_id"], 60)):  # done
            with pytest.raises(RuntimeError, match="Invalid structured content returned by tool wait_task"):
                await client.call_tool("wait_task", {"task_id": task_id, "timeout_s": timeout_s})
        assert not (await client.call_tool("cancel_task", {"task_id": long.structured_content["task_id"]})).is_error
        with pytest.raises(RuntimeError, match="Invalid structured content returned by tool exercise"):
            await client.call_tool("exercise", {})
        gone = await client.call_tool("get_task_status", {"task_id": UNKNOWN_ID})  # an error is not held to it
        assert gone.is_error and gone.structured_content["code"] == "NOT_FOUND"
