"""Tasks as resources, catalog tools as prompts, and argument completion (seed 002).

- Resource templates: `task://{task_id}` (the caller's task: status, result once it ended, the
  last log lines) and `tool://{tool_name}` (a catalog entry: description, input schema, estimate).
- One prompt per catalog tool, named like the tool, whose arguments are the tool's: a host that
  shows prompts as commands completes their values, and the rendered prompt asks the model to run
  the tool as a task with them (`$.field` values resolved from the other arguments).
- `completion/complete` (the completions capability): task ids of the caller only, tool names,
  and the prompts' argument values (schema enums, previously used values, `$.field` references).
- The extension `io.github.mcp-controlplane/completion` adds the method of the same name, which
  completes an argument of any tool (catalog or canonical): `{ref: {type: "ref/tool", name},
  argument: {name, value}, context: {arguments}}`, answered like `completion/complete`. The
  standard method cannot name a tool; this one can.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
import mcp_types
from fastmcp.prompts.base import Prompt, PromptArgument
from fastmcp.server.extensions import MethodBinding, ServerExtension
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from controlplane import api
from controlplane.completion import Candidates, Completer, resolve
from controlplane.errors import ControlPlaneError
from controlplane.mcp.tools import caller
from controlplane.states import TERMINAL, TaskState

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane

EXTENSION_ID = "io.github.mcp-controlplane/completion"
TASK_TEMPLATE = "task://{task_id}"
TOOL_TEMPLATE = "tool://{tool_name}"
RESOURCE_LOG_LINES = 50


def wire(c: Candidates) -> mcp_types.Completion:
    return mcp_types.Completion(values=c.values, total=c.total, has_more=c.has_more)


def not_found(uri: str) -> MCPError:
    """What fastmcp answers for an unknown resource (SEP-2164), raised from inside a template."""
    return MCPError(code=INVALID_PARAMS, message=f"Resource not found: {uri!r}", data={"uri": uri})


# ---- resources -------------------------------------------------------------------------------
def task_document(cp: ControlPlane, owner: str, task_id: str) -> str:
    """The task as one JSON document: status, result (once it ended), the last log lines."""
    svc = cp.service
    try:
        ref = api.GetTaskStatus(task_id=task_id)
        status = svc.status(owner, ref)
        logs = svc.tail(owner, api.TailTaskLogs(task_id=task_id, from_end=True, limit=RESOURCE_LOG_LINES))
    except (ValidationError, ControlPlaneError) as e:
        if isinstance(e, ControlPlaneError) and e.code.value != "NOT_FOUND":
            raise MCPError(code=INVALID_PARAMS, message=e.message) from None
        raise not_found(f"task://{task_id}") from None  # unknown and someone else's alike
    result: dict[str, Any] | None = None
    if TaskState(status["state"]) in TERMINAL or status["state"] == TaskState.EXPIRED:
        try:
            result = svc.result(owner, api.GetTaskResult(task_id=task_id))
        except ControlPlaneError as e:
            result = {"error": e.to_dict()}
    return json.dumps({"status": status, "result": result, "logs": logs}, separators=(",", ":"))


def tool_document(cp: ControlPlane, tool_name: str) -> str:
    spec = cp.catalog.tool(tool_name)
    if spec is None:
        raise not_found(f"tool://{tool_name}")
    return json.dumps({"name": spec.name, "description": spec.description, "schemaVersion": spec.schema_version,
                       "inputSchema": spec.input_schema, "provider": spec.provider,
                       "resourceClass": spec.resource_class, "defaultRuntimeSeconds": spec.default_runtime_s,
                       "maxRuntimeSeconds": spec.max_runtime_s,
                       "estimatedRuntimeSeconds": cp.service.estimator.estimate(spec, None)},
                      separators=(",", ":"))


# ---- prompts ---------------------------------------------------------------------------------
class RunToolPrompt(Prompt):
    """A catalog tool as a prompt: its arguments are the tool's (values as JSON or plain text)."""

    tool_input_schema: dict[str, Any] = Field(default_factory=dict, exclude=True)
    validate_inputs: SkipJsonSchema[Callable[[str, dict[str, Any]], None]] = Field(exclude=True)

    async def render(self, arguments: dict[str, Any] | None = None) -> str:
        props = self.tool_input_schema.get("properties", {})
        given = {k: _typed(v, props.get(k)) for k, v in (arguments or {}).items() if v is not None and v != ""}
        values = {name: resolve(v, name, given) for name, v in given.items()}
        try:
            self.validate_inputs(self.name, values)  # what submitting them would say
        except ControlPlaneError as e:
            raise MCPError(code=INVALID_PARAMS, message=e.message) from None
        inputs = json.dumps(values, indent=2, sort_keys=True)
        return (f"Run the tool `{self.name}` as a durable task with these arguments:\n\n```json\n{inputs}\n```\n\n"
                "The call returns a task id at once. Then call wait_task with that id (it streams progress "
                "and returns the result), or poll get_task_status; get_task_result gives the result and "
                "download links for its artifacts.")


def _typed(v: Any, schema: dict[str, Any] | None) -> Any:
    """A prompt argument (always text) as the tool's argument: JSON unless the field is a string."""
    types = (schema or {}).get("type")
    if "string" in (types if isinstance(types, list) else [types]):
        return v
    return _json_or_text(v)


def _json_or_text(v: Any) -> Any:
    """The value the text spells in JSON, else the text as it is (the tool's schema then says
    what is wrong with it): nesting too deep to parse, and what JSON cannot carry (NaN, a
    `\\ud800` escape, see `api.json_problem`), stay text."""
    if not isinstance(v, str):
        return v
    try:
        parsed = json.loads(v)
    except (ValueError, RecursionError):
        return v
    return v if api.json_problem(parsed) is not None else parsed


def tool_prompt(spec: Any, validate_inputs: Callable[[str, dict[str, Any]], None]) -> RunToolPrompt:
    schema = spec.input_schema
    required = set(schema.get("required", []))
    args = [PromptArgument(name=n, description=(p or {}).get("description"), required=n in required)
            for n, p in schema.get("properties", {}).items()]
    return RunToolPrompt(name=spec.name, description=f"Run {spec.name} as a durable task. {spec.description}",
                         arguments=args, tool_input_schema=schema, validate_inputs=validate_inputs,
                         meta={"schemaVersion": spec.schema_version})


# ---- the extension method ------------------------------------------------------------------------
class ToolReference(BaseModel):
    type: Literal["ref/tool"] = "ref/tool"
    name: str


class ToolArgumentContext(BaseModel):
    arguments: dict[str, Any] | None = None  # JSON values (the standard context has strings only)


class CompleteToolParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    ref: ToolReference
    argument: mcp_types.CompletionArgument
    context: ToolArgumentContext | None = None


class CompletionExtension(ServerExtension):
    identifier = EXTENSION_ID

    def __init__(self, cp: ControlPlane, completer: Completer):
        self.cp = cp
        self.completer = completer

    def clone(self) -> CompletionExtension:
        return CompletionExtension(self.cp, self.completer)

    def methods(self) -> Sequence[MethodBinding]:
        return [MethodBinding(EXTENSION_ID, CompleteToolParams, self._complete)]

    async def _complete(self, ctx: ServerRequestContext[Any, Any], params: CompleteToolParams) -> dict[str, Any]:
        owner = caller(self.cp.settings.default_owner)
        args = (params.context.arguments if params.context else None) or {}
        found = await anyio.to_thread.run_sync(self.completer.argument, owner, params.ref.name,
                                               params.argument.name, params.argument.value, args)
        if found is None:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool '{params.ref.name}'", data={"tool": params.ref.name})
        out: dict[str, Any] = {"completion": wire(found).model_dump(by_alias=True, exclude_none=True)}
        return {"resultType": "complete", **out} if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else out


# ---- wiring --------------------------------------------------------------------------------------
def install(mcp: FastMCP, cp: ControlPlane, schemas: dict[str, dict[str, Any]]) -> Completer:
    """`schemas`: the input schema of every served tool, by name, as served."""
    completer = Completer(cp, schemas)
    owner_default = cp.settings.default_owner

    @mcp.resource(TASK_TEMPLATE, name="task", mime_type="application/json",
                  description="One of your tasks: its status (state, progress, ETA), its result once it ended "
                              f"(with artifact links) and its last {RESOURCE_LOG_LINES} log lines.")
    async def task_resource(task_id: str) -> str:
        return await anyio.to_thread.run_sync(task_document, cp, caller(owner_default), task_id)

    @mcp.resource(TOOL_TEMPLATE, name="catalog_tool", mime_type="application/json",
                  description="A tool of the catalog: description, input schema, provider, limits and the "
                              "runtime estimate from its history.")
    async def tool_resource(tool_name: str) -> str:
        return await anyio.to_thread.run_sync(tool_document, cp, tool_name)

    for spec in cp.catalog.tools.values():
        mcp.add_prompt(tool_prompt(spec, cp.service.validate_inputs))

    @mcp.completion
    async def complete(ref: Any, argument: mcp_types.CompletionArgument,
                       context: mcp_types.CompletionContext | None) -> mcp_types.Completion | None:
        owner = caller(owner_default)
        args: dict[str, Any] = dict((context.arguments if context else None) or {})
        if isinstance(ref, mcp_types.ResourceTemplateReference):
            if ref.uri == TASK_TEMPLATE and argument.name == "task_id":
                return wire(await anyio.to_thread.run_sync(completer.task_ids, owner, argument.value))
            if ref.uri == TOOL_TEMPLATE and argument.name == "tool_name":
                return wire(completer.tool_names(argument.value))
            return None
        spec = cp.catalog.tool(ref.name)
        if spec is None:
            return None
        props = spec.input_schema.get("properties", {})
        args = {k: _typed(v, props.get(k)) for k, v in args.items()}
        found = await anyio.to_thread.run_sync(completer.argument, owner, ref.name, argument.name,
                                               argument.value, args)
        return wire(found) if found is not None else None

    mcp.add_extension(CompletionExtension(cp, completer))
    return completer
