"""Argument completion over MCP (docs/design/progress-and-completion.md): `completion/complete` (the completions capability)
for task ids (the caller's only), tool names and the prompts' argument values; and the extension
`io.github.mcp-controlplane/completion`, which completes an argument of any tool (catalog or
canonical): `{ref: {type: "ref/tool", name}, argument: {name, value}, context: {arguments}}`,
answered like `completion/complete`. The standard method cannot name a tool; this one can. The
candidates themselves come from `controlplane.mcp.candidates`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
import mcp_types
from fastmcp.server.extensions import MethodBinding, ServerExtension
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict

from controlplane.mcp.candidates import Candidates, Completer
from controlplane.mcp.prompts import typed_argument
from controlplane.mcp.resources import TASK_TEMPLATE, TOOL_TEMPLATE
from controlplane.mcp.tools import current_caller

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane

EXTENSION_ID = "io.github.mcp-controlplane/completion"


def wire(c: Candidates) -> mcp_types.Completion:
    return mcp_types.Completion(values=c.values, total=c.total, has_more=c.has_more)


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
        caller = current_caller(self.cp.settings.default_owner)
        args = (params.context.arguments if params.context else None) or {}
        found = await anyio.to_thread.run_sync(self.completer.argument, caller, params.ref.name,
                                               params.argument.name, params.argument.value, args)
        if found is None:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool '{params.ref.name}'", data={"tool": params.ref.name})
        out: dict[str, Any] = {"completion": wire(found).model_dump(by_alias=True, exclude_none=True)}
        return {"resultType": "complete", **out} if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else out


def install(mcp: FastMCP, cp: ControlPlane, schemas: dict[str, dict[str, Any]]) -> Completer:
    """`schemas`: the input schema of every served tool, by name, as served."""
    completer = Completer(cp.service, cp.catalog, schemas)
    owner_default = cp.settings.default_owner

    @mcp.completion
    async def complete(ref: Any, argument: mcp_types.CompletionArgument,
                       context: mcp_types.CompletionContext | None) -> mcp_types.Completion | None:
        caller = current_caller(owner_default)
        args: dict[str, Any] = dict((context.arguments if context else None) or {})
        if isinstance(ref, mcp_types.ResourceTemplateReference):
            if ref.uri == TASK_TEMPLATE and argument.name == "task_id":
                return wire(await anyio.to_thread.run_sync(completer.task_ids, caller, argument.value))
            if ref.uri == TOOL_TEMPLATE and argument.name == "tool_name":
                return wire(completer.tool_names(argument.value))
            return None
        spec = cp.catalog.tool(ref.name)
        if spec is None:
            return None
        props = spec.input_schema.get("properties", {})
        args = {k: typed_argument(v, props.get(k)) for k, v in args.items()}
        found = await anyio.to_thread.run_sync(completer.argument, caller, ref.name, argument.name,
                                               argument.value, args)
        return wire(found) if found is not None else None

    mcp.add_extension(CompletionExtension(cp, completer))
    return completer
