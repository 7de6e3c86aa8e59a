"""A stable, versioned tool schema (docs/design/errors-and-cancellation.md).

`tests/snapshots/tools_list.json` is the complete tools/list answer of a server on the default
catalog. Any change to a tool (description, input schema, annotations, _meta) must come with a
higher schemaVersion for that tool; then regenerate the snapshot with

    UPDATE_SNAPSHOTS=1 python -m pytest tests/test_schema.py

which refuses to record a change that did not bump schemaVersion. toolingVersion (the server's
version) may change without a bump.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from jsonschema import Draft202012Validator

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server

pytestmark = pytest.mark.anyio
SNAPSHOT = Path(__file__).parent / "snapshots" / "tools_list.json"
CANONICAL = {"submit_task", "get_task_status", "tail_task_logs", "list_tasks", "cancel_task", "get_task_result",
             "wait_task"}


async def served_tools(cp: ControlPlane, mode: str = "auto") -> list[dict[str, Any]]:
    async with Client(build_server(cp, with_auth=False), mode=mode) as client:
        tools = await client.list_tools()
    return [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools]


def comparable(tool: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in tool.get("_meta", {}).items() if k != "toolingVersion"}
    return {**tool, "_meta": meta}


def unversioned_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """The tools that changed but kept their schemaVersion (or lowered it)."""
    before = {t["name"]: t for t in old}
    out = []
    for tool in new:
        prev = before.get(tool["name"])
        if prev is None or comparable(prev) == comparable(tool):
            continue
        if tool["_meta"]["schemaVersion"] <= prev["_meta"]["schemaVersion"]:
            out.append(tool["name"])
    return out


async def test_tools_list_matches_the_snapshot(cp: ControlPlane) -> None:
    tools = await served_tools(cp)
    old = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else []
    unbumped = unversioned_changes(old, tools)
    assert not unbumped, (f"tools changed without a schemaVersion bump: {unbumped}; raise their schemaVersion "
                          "(canonical tools: controlplane/mcp/server.py; catalog tools: the catalog)")
    removed = {t["name"] for t in old} - {t["name"] for t in tools}
    assert not removed, f"tools removed from tools/list: {sorted(removed)} (a breaking change)"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(tools, indent=2, sort_keys=True) + "\n")
        return
    assert tools == old, "tools/list changed (with schemaVersion bumped): run UPDATE_SNAPSHOTS=1 pytest tests/test_schema.py"


async def test_both_eras_list_the_same_tools(cp: ControlPlane) -> None:
    modern, legacy = await served_tools(cp, "auto"), await served_tools(cp, "legacy")
    assert [comparable(t) for t in modern] == [comparable(t) for t in legacy]


async def test_every_tool_is_described_versioned_and_closed(cp: ControlPlane) -> None:
    tools = await served_tools(cp)
    assert CANONICAL <= {t["name"] for t in tools}
    for tool in tools:
        name = tool["name"]
        assert len(tool.get("description", "")) > 20, name
        Draft202012Validator.check_schema(tool["inputSchema"])
        if "outputSchema" in tool:
            Draft202012Validator.check_schema(tool["outputSchema"])
        assert tool["inputSchema"]["type"] == "object", name
        # no argument is accepted and ignored: unknown arguments are rejected by the schema itself
        assert tool["inputSchema"].get("additionalProperties") is False, name
        assert "$ref" not in json.dumps(tool["inputSchema"]), name  # self-contained for every client
        meta = tool["_meta"]
        assert isinstance(meta["schemaVersion"], int) and meta["schemaVersion"] >= 1, name
        assert meta["toolingVersion"] == "0.1.0", name


def test_a_change_without_a_bump_is_caught() -> None:
    """The rule the snapshot test applies, on a made-up change (so that it can fail)."""
    old = [{"name": "t", "description": "d", "inputSchema": {}, "_meta": {"schemaVersion": 1, "toolingVersion": "1"}}]
    described = [{**old[0], "description": "e"}]
    bumped = [{**described[0], "_meta": {"schemaVersion": 2, "toolingVersion": "1"}}]
    new_release = [{**old[0], "_meta": {"schemaVersion": 1, "toolingVersion": "2"}}]
    assert unversioned_changes(old, described) == ["t"]
    assert unversioned_changes(old, bumped) == []
    assert unversioned_changes(old, new_release) == []


async def test_every_tool_result_carries_its_duration(cp: ControlPlane) -> None:
    """Every result, error results included, has `_meta.duration` in milliseconds."""
    async with Client(build_server(cp, with_auth=False)) as client:
        first = await client.call_tool("exercise", {})
        task_id = first.structured_content["task_id"]
        calls = {"submit_task": {"tool_name": "exercise"}, "get_task_status": {"task_id": task_id},
                 "tail_task_logs": {"task_id": task_id}, "list_tasks": {}, "get_task_result": {"task_id": task_id},
                 "wait_task": {"task_id": task_id, "timeout_s": 5}, "cancel_task": {"task_id": task_id},
                 "lj_relax": {"n_atoms": 2, "max_steps": 1}, "no_such_tool": {}, "get_task_status ": {"x": 1}}
        results = [first] + [await client.call_tool(name.strip(), args, raise_on_error=False)
                             for name, args in calls.items()]
        assert [r.is_error for r in results[-2:]] == [True, True]
        for res in results:
            assert isinstance(res.meta["duration"], float | int) and res.meta["duration"] >= 0
