"""Completion (docs/design/progress-and-completion.md): tasks as resources, catalog tools as prompts, `completion/complete`, and
the completion extension method for any tool's arguments. Driven by fastmcp's Client (both eras)
and the `mcp` SDK's client, in process and over HTTP with two callers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp
import mcp_types
import pytest
from fastmcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PromptReference, ResourceTemplateReference
from pydantic import BaseModel, ConfigDict

from controlplane.app import ControlPlane
from controlplane.mcp.completion import EXTENSION_ID
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, catalog_text, serving

pytestmark = pytest.mark.anyio
TASK = ResourceTemplateReference(uri="task://{task_id}")
TOOL = ResourceTemplateReference(uri="tool://{tool_name}")

# A tool with an enum, a boolean, a small range and a free string, besides the default catalog.
RENDER_TOOL = """
[tools.render]
description = "Render a scene."
resource_class = "cpu_small"
command = ["{python}", "-m", "controlplane_tools.exercise"]
estimate_s = 5

[tools.render.input_schema]
type = "object"
additionalProperties = false
required = ["scene"]
properties.scene = { type = "string", description = "Scene file" }
properties.quality = { enum = ["draft", "preview", "final"], default = "preview" }
properties.denoise = { type = "boolean" }
properties.passes = { type = "integer", minimum = 1, maximum = 4 }
properties.frames = { type = "integer", minimum = 1, maximum = 100000, examples = [24, 240] }
properties.output = { type = "string" }
"""


@pytest.fixture
def cp(home: Path) -> ControlPlane:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + RENDER_TOOL)
    return ControlPlane(Settings(home=home, auth_tokens="tok-alice=alice,tok-bob=bob", **FAST))


class ToolRef(BaseModel):
    type: Literal["ref/tool"] = "ref/tool"
    name: str


class CompleteToolParams(mcp_types.RequestParams):
    ref: ToolRef
    argument: mcp_types.CompletionArgument
    context: dict[str, Any] | None = None


class CompleteToolRequest(mcp_types.Request[CompleteToolParams, Literal["io.github.mcp-controlplane/completion"]]):
    method: Literal["io.github.mcp-controlplane/completion"] = EXTENSION_ID  # type: ignore[assignment]
    params: CompleteToolParams


class AnyResult(mcp_types.Result):
    model_config = ConfigDict(extra="allow")


async def complete_tool(client: Any, tool: str, argument: str, value: str, **arguments: Any) -> list[str]:
    """The extension method, with either client (both expose `session.send_request`)."""
    params = CompleteToolParams(ref=ToolRef(name=tool), argument=mcp_types.CompletionArgument(name=argument, value=value),
                                context={"arguments": arguments} if arguments else None)
    res = await client.session.send_request(CompleteToolRequest(params=params), AnyResult)
    return res.model_dump(by_alias=True)["completion"]["values"]


async def values(client: Client, ref: Any, name: str, value: str, **context: str) -> list[str]:
    res = await client.complete(ref, {"name": name, "value": value}, context_arguments=context or None)
    return res.values


async def finished(agent: Agent, tool: str, **inputs: Any) -> str:
    task_id = (await agent.call(tool, **inputs))["task_id"]
    await agent.wait(task_id)
    return task_id


# ---- capabilities ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_completions_capability_is_declared(cp: ControlPlane, mode: str) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice", mode=mode) as client:
        caps = client.server_capabilities
        assert caps is not None and caps.completions is not None
        assert caps.resources is not None and caps.prompts is not None
        if mode == "auto":  # extensions are negotiated in the 2026-07-28 era only
            assert EXTENSION_ID in (caps.extensions or {})


# ---- task ids: the caller's only -------------------------------------------------------------------------
PREFIX = len("tsk_") + 10 + 4  # the clock, then 20 random bits


async def test_task_ids_complete_for_their_owner_only(cp: ControlPlane) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice") as alice_c, \
            Client(server.url, auth="tok-bob") as bob_c:
        alice, bob = Agent(alice_c), Agent(bob_c)
        mine = [await finished(alice, "exercise") for _ in range(3)]
        theirs = await finished(bob, "exercise")
        assert await values(alice_c, TASK, "task_id", "") == mine[::-1]  # newest first
        assert await values(bob_c, TASK, "task_id", "tsk_") == [theirs]
        # a longer prefix (looked up in the id index) narrows to one task, and never to another's.
        # Ids begin with their submission time (controlplane.ids): a prefix that names one task
        # runs into its random part (`PREFIX` characters); a shorter one names a stretch of time.
        assert await values(alice_c, TASK, "task_id", mine[1][:PREFIX]) == [mine[1]]
        assert set(await values(alice_c, TASK, "task_id", mine[1][:9])) >= {mine[1]}
        assert await values(alice_c, TASK, "task_id", theirs[:PREFIX]) == []
        assert await values(alice_c, TASK, "task_id", theirs[:9]) == [t for t in mine[::-1] if t[:9] == theirs[:9]]
        assert await values(alice_c, TASK, "task_id", theirs) == []
        # the canonical tools' task_id argument, through the extension method, too
        assert await complete_tool(bob_c, "get_task_status", "task_id", "") == [theirs]
        assert await complete_tool(alice_c, "wait_task", "task_id", mine[0][:PREFIX]) == [mine[0]]


async def test_more_than_a_hundred_task_ids_page_as_has_more(cp: ControlPlane) -> None:
    from controlplane import api

    async with cp.running():
        ids = [cp.service.submit("alice", api.SubmitTask(tool_name="render", inputs={"scene": f"s{i}"}))["task_id"]
               for i in range(105)]
        async with Client(build_server(cp, with_auth=False)) as client:
            assert cp.settings.default_owner != "alice"
            assert (await client.complete(TASK, {"name": "task_id", "value": ""})).values == []
        from controlplane.mcp.candidates import Completer

        got = Completer(cp.service, cp.catalog, {}).task_ids("alice", "tsk_")
        assert got.values == ids[::-1][:100] and got.has_more and got.total is None


# ---- the task resource ------------------------------------------------------------------------------------
async def test_a_task_reads_as_one_document_for_its_owner(cp: ControlPlane) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice") as alice_c, \
            Client(server.url, auth="tok-bob") as bob_c:
        task_id = await finished(Agent(alice_c), "exercise", log_lines=80, progress_steps=2,
                                 artifact_names=["out.txt"])
        doc = json.loads((await alice_c.read_resource(f"task://{task_id}"))[0].text)
        assert doc["status"]["state"] == "succeeded" and doc["status"]["progress"]["percent"] == 100
        assert [a["name"] for a in doc["result"]["artifacts"]] == ["out.txt"]
        assert doc["result"]["artifacts"][0]["download_url"].startswith("http://127.0.0.1")
        lines = [ln["message"] for ln in doc["logs"]["lines"] if ln["stream"] == "stdout"]
        assert len(doc["logs"]["lines"]) == 50 and lines[-1].endswith("79")  # the last lines
        for uri in (f"task://{task_id}", "task://tsk_unknown", "task://not-an-id"):
            with pytest.raises(MCPError) as e:
                await bob_c.read_resource(uri)
            assert "not found" in str(e.value).lower()
            assert "Traceback" not in str(e.value)


async def test_a_running_task_reads_without_a_result(cp: ControlPlane) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice") as client:
        agent = Agent(client)
        task_id = (await agent.call("exercise", sleep_s=30))["task_id"]
        await agent.wait(task_id, {"running"})
        doc = json.loads((await client.read_resource(f"task://{task_id}"))[0].text)
        assert doc["status"]["state"] == "running" and doc["result"] is None
        await agent.call("cancel_task", task_id=task_id)
        await agent.wait(task_id)


async def test_catalog_tools_read_and_complete_by_name(cp: ControlPlane) -> None:
    async with Client(build_server(cp, with_auth=False)) as client:
        assert await values(client, TOOL, "tool_name", "") == ["exercise", "lj_relax", "render"]
        assert await values(client, TOOL, "tool_name", "L") == ["lj_relax"]  # case-insensitive prefix
        doc = json.loads((await client.read_resource("tool://render"))[0].text)
        assert doc["inputSchema"]["required"] == ["scene"] and doc["estimatedRuntimeSeconds"] == 5
        with pytest.raises(Exception, match="(?i)not found"):
            await client.read_resource("tool://submit_task")
        assert await complete_tool(client, "submit_task", "tool_name", "ex") == ["exercise"]


# ---- argument values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_schema_values_complete_prompt_arguments(cp: ControlPlane, mode: str) -> None:
    async with Client(build_server(cp, with_auth=False), mode=mode) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
        assert set(prompts) == {"exercise", "lj_relax", "render"}
        assert [a.name for a in prompts["render"].arguments or []][:2] == ["scene", "quality"]
        render = PromptReference(name="render")
        assert await values(client, render, "quality", "") == ["draft", "preview", "final"]
        assert await values(client, render, "quality", "pr") == ["preview"]
        assert await values(client, render, "denoise", "") == ["true", "false"]
        assert await values(client, render, "passes", "") == ["1", "2", "3", "4"]
        assert await values(client, render, "frames", "2") == ["24", "240"]  # examples
        assert await values(client, render, "nonexistent", "") == []
        assert await values(client, PromptReference(name="nope"), "x", "") == []


async def test_previously_used_values_are_the_callers_newest_first(cp: ControlPlane) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice") as alice_c, \
            Client(server.url, auth="tok-bob") as bob_c:
        alice, bob = Agent(alice_c), Agent(bob_c)
        for scene in ("city.blend", "forest.blend", "city.blend", "cave.blend"):
            await alice.call("render", scene=scene)
        await bob.call("render", scene="secret-bob.blend")
        render = PromptReference(name="render")
        assert await values(alice_c, render, "scene", "") == ["cave.blend", "city.blend", "forest.blend"]
        assert await values(alice_c, render, "scene", "c") == ["cave.blend", "city.blend"]
        assert await values(bob_c, render, "scene", "") == ["secret-bob.blend"]
        # the same through the extension method, and through submit_task's inputs.<field>
        assert await complete_tool(alice_c, "render", "scene", "f") == ["forest.blend"]
        assert await complete_tool(alice_c, "submit_task", "inputs.scene", "ci", tool_name="render") == ["city.blend"]
        assert await complete_tool(alice_c, "submit_task", "inputs.quality", "f", tool_name="render") == ["final"]


async def test_dollar_references_resolve_from_the_other_arguments(cp: ControlPlane) -> None:
    async with Client(build_server(cp, with_auth=False)) as client:
        render = PromptReference(name="render")
        ctx = {"scene": "city.blend", "frames": "240"}
        assert await values(client, render, "output", "$.sc", **ctx) == ["city.blend"]
        assert await values(client, render, "output", "$.", **ctx) == ["city.blend", "240"]
        assert await values(client, render, "output", "$.zz", **ctx) == []
        assert await values(client, render, "scene", "$.sc", scene="x") == []  # never itself
        nested = {"opts": {"lr": 0.1, "inner": {"k": "v"}}}
        assert await complete_tool(client, "render", "output", "$.opts.", **nested) == ["0.1", "$.opts.inner."]
        assert await complete_tool(client, "render", "output", "$.opts.inner.k", **nested) == ["v"]


async def test_canonical_arguments_complete_from_their_schemas(cp: ControlPlane) -> None:
    async with Client(build_server(cp, with_auth=False)) as client:
        states = await complete_tool(client, "list_tasks", "states", "")
        assert {"queued", "running", "succeeded", "failed", "cancelled"} <= set(states)
        assert await complete_tool(client, "tail_task_logs", "from_end", "t") == ["true"]
        assert await complete_tool(client, "tail_task_logs", "source", "") == ["task", "provider"]
        assert await complete_tool(client, "submit_task", "inputs.scene", "", tool_name="nope") == []
        with pytest.raises(MCPError) as e:
            await complete_tool(client, "no_such_tool", "x", "")
        assert e.value.error.code == mcp_types.INVALID_PARAMS


async def test_the_mcp_sdk_client_completes_too(cp: ControlPlane) -> None:
    async with serving(cp) as server:
        async with Client(server.url, auth="tok-alice") as c:
            task_id = await finished(Agent(c), "render", scene="a.blend", quality="final")
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http, \
                mcp.Client(streamable_http_client(server.url, http_client=http)) as sdk:
            assert sdk.server_capabilities.completions is not None
            assert (await sdk.complete(TASK, {"name": "task_id", "value": "tsk"})).completion.values == [task_id]
            got = await sdk.complete(PromptReference(name="render"), {"name": "scene", "value": ""})
            assert got.completion.values == ["a.blend"]
            doc = json.loads((await sdk.read_resource(f"task://{task_id}")).contents[0].text)
            assert doc["status"]["state"] == "succeeded"
            assert await complete_tool(sdk, "render", "quality", "") == ["draft", "preview", "final"]


# ---- prompts render to a call -------------------------------------------------------------------------------
async def test_a_prompt_renders_the_call_with_references_resolved(cp: ControlPlane) -> None:
    async with Client(build_server(cp, with_auth=False)) as client:
        res = await client.get_prompt("render", {"scene": "city.blend", "output": "$.scene", "frames": "24"})
        text = res.messages[0].content.text
        args = json.loads(text.split("```json\n")[1].split("\n```")[0])
        assert args == {"scene": "city.blend", "output": "city.blend", "frames": 24}
        assert "wait_task" in text
        with pytest.raises(MCPError) as e:
            await client.get_prompt("render", {"scene": "a", "quality": "ultra"})
        assert e.value.error.code == mcp_types.INVALID_PARAMS and "quality" in e.value.error.message
