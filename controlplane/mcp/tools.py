"""MCP tool components: the six canonical task tools and one tool per catalog entry.

Each tool validates its arguments itself (unknown fields and wrong types are INVALID_REQUEST),
calls the task service in a worker thread, and answers with JSON: the result as text content
and as structured content, or an `isError` result carrying `{code, message, hint?}`. Each tool
publishes its answer model's schema as its `outputSchema`, made once when the server is built.
Unexpected exceptions are logged here and reach the client only as `INTERNAL`.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from fastmcp.server.dependencies import get_access_token, get_context
from fastmcp.tools.base import Tool, ToolResult
from fastmcp.utilities.json_schema import dereference_refs
from fastmcp.utilities.tasks import TaskConfig
from mcp_types import TextContent, ToolAnnotations
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, SkipJsonSchema
from pydantic_core import core_schema

from controlplane import blocking
from controlplane.errors import ControlPlaneError, ErrorCode, invalid
from controlplane.mcp.oauth import CallerToken

log = logging.getLogger("controlplane.mcp")
TOOLING_VERSION = "0.1.0"


def current_caller(default_owner: str) -> str:
    """The identity of the caller: the bearer token's identity (an OAuth token's owner,
    "<issuer>#<subject>", with its team and admin rights: `controlplane.identity`), else the
    default owner."""
    token = get_access_token()
    if token is None:
        return default_owner
    if type(token) is CallerToken:
        return token.caller  # type: ignore[no-any-return]
    return token.client_id or default_owner


def _meta(started: float) -> dict[str, Any]:
    """Every result says how long it took (ms), and echoes the call's progressToken."""
    meta: dict[str, Any] = {"duration": round((time.perf_counter() - started) * 1000, 3)}
    try:
        rc = get_context().request_context
    except RuntimeError:
        return meta
    token = (rc.meta or {}).get("progressToken") if rc is not None else None
    if token is not None:
        meta["progressToken"] = token
    return meta


def ok(data: dict[str, Any], started: float) -> ToolResult:
    return ToolResult(content=[TextContent(type="text", text=json.dumps(data, separators=(",", ":")))],
                      structured_content=data, meta=_meta(started))


def error(err: ControlPlaneError, started: float) -> ToolResult:
    data = err.to_dict()
    return ToolResult(content=[TextContent(type="text", text=json.dumps(data, separators=(",", ":")))],
                      structured_content=data, is_error=True, meta=_meta(started))


def describe_validation_error(e: ValidationError) -> ControlPlaneError:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(arguments)"
    if first["type"] == "extra_forbidden":
        return invalid(f"unknown argument '{where}'", hint="see the tool's input schema; unknown arguments are rejected")
    if first["type"] == "missing":
        return invalid(f"missing required argument '{where}'")
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return invalid(f"{where}: {first['msg']}{more}")


def inline_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every $ref inlined, once, at startup. Clients that cannot follow $ref get
    self-contained schemas, and fastmcp need not dereference them on every request."""
    return dereference_refs(schema) if "$defs" in schema or "$ref" in json.dumps(schema) else schema


class AnswerSchema(GenerateJsonSchema):
    """Pydantic's JSON schema, lighter for a client that checks every answer against it: a
    nullable scalar is `"type": [t, "null"]` rather than an `anyOf` of two schemas, and fields get
    no generated titles. The same instances validate."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        inner = self.generate_inner(schema["schema"])
        if set(inner) == {"type"} and isinstance(inner["type"], str) and inner["type"] != "null":
            return {"type": [inner["type"], "null"]}
        return super().nullable_schema(schema)


def output_schema(answer: Any) -> dict[str, Any]:
    """The JSON schema of what a tool writes as structured content: `answer`'s (a model of
    `controlplane.service.answers`, or a union of them) in serialization mode, keys by alias,
    every $ref inlined. Its root says `"type": "object"` (a union's too), as the 2025-11-25 wire
    requires of an outputSchema; a union stays an `anyOf` of its shapes."""
    schema = inline_schema(TypeAdapter(answer).json_schema(mode="serialization", by_alias=True,
                                                           schema_generator=AnswerSchema))
    return schema if schema.get("type") == "object" else {"type": "object", **schema}


class ServiceTool(Tool):
    """A tool whose body is `handler(caller, arguments)`. With `inline` the body is tried on the
    event loop first (no thread hop) and moved to a worker thread if it would block (see
    `controlplane.blocking`); otherwise it runs in a worker thread."""

    handler: SkipJsonSchema[Callable[[str, dict[str, Any]], Any]]
    default_owner: SkipJsonSchema[str] = "local"
    inline: SkipJsonSchema[bool] = False
    # The handler is a coroutine function that runs on the event loop and decides itself what
    # goes to a thread (submits: a group commit, see controlplane.group_commit).
    awaited: SkipJsonSchema[bool] = False
    # Called with (caller, answer) after a successful call: the two-stage follower of new tasks.
    after: SkipJsonSchema[Callable[[str, dict[str, Any]], None] | None] = None

    def to_mcp_tool(self, **overrides: Any) -> Any:
        # fastmcp advertises `execution.taskSupport` from the task config, which only the
        # 2025-11-25 wire carries; tasks cannot be created on that wire (see mcp/tasks.py), so
        # saying so there would invite clients to send `params.task` in vain.
        tool = super().to_mcp_tool(**overrides)
        tool.execution = None
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        started = time.perf_counter()
        caller = current_caller(self.default_owner)
        try:
            out = await self._body(caller, arguments)
            if self.after is not None:
                self.after(caller, out)
        except ControlPlaneError as e:
            return error(e, started)
        except Exception:
            log.exception("tool %s failed", self.name)
            return error(ControlPlaneError(ErrorCode.INTERNAL, "internal error; the server log has the details"),
                         started)
        return ok(out, started)


    async def _body(self, caller: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.awaited:
            return await self.handler(caller, arguments)  # type: ignore[no-any-return]
        if self.inline:
            return await blocking.call(self.handler, caller, arguments)
        return await anyio.to_thread.run_sync(self.handler, caller, arguments)


def canonical_tool(name: str, description: str, model: type[BaseModel], answer: Any,
                   method: Callable[[str, Any], Any], *, default_owner: str, read_only: bool,
                   inline: bool = False, after: Callable[[str, dict[str, Any]], None] | None = None,
                   schema_version: int = 1) -> ServiceTool:
    """A tool calling `method(caller, request)`, whose answers are `answer`'s (its outputSchema);
    a coroutine function `method` is awaited on the event loop (see ServiceTool.awaited), any
    other runs per `inline`."""
    def parse(arguments: dict[str, Any]) -> Any:
        try:
            return model.model_validate_json(json.dumps(arguments))
        except ValidationError as e:
            raise describe_validation_error(e) from None

    def handler(caller: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return method(caller, parse(arguments))  # type: ignore[no-any-return]

    async def awaited_handler(caller: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await method(caller, parse(arguments))  # type: ignore[no-any-return]

    awaited = inspect.iscoroutinefunction(method)
    return ServiceTool(
        name=name, description=description, parameters=inline_schema(model.model_json_schema()),
        output_schema=output_schema(answer), handler=awaited_handler if awaited else handler, awaited=awaited,
        default_owner=default_owner, inline=inline, after=after,
        annotations=ToolAnnotations(readOnlyHint=read_only, destructiveHint=False, openWorldHint=False),
        meta={"schemaVersion": schema_version, "toolingVersion": TOOLING_VERSION},
    )


def catalog_tool(spec: Any, submit_direct: Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]], *,
                 answer_schema: dict[str, Any], default_owner: str,
                 after: Callable[[str, dict[str, Any]], None] | None = None) -> ServiceTool:
    """The tool of catalog entry `spec`: its arguments are the task's inputs; it answers with the
    task it queued, or as a task of the tasks extension (`answer_schema`, its outputSchema, says
    both: made once, shared by every catalog tool)."""
    async def handler(caller: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await submit_direct(caller, spec.name, arguments)

    return ServiceTool(
        name=spec.name,
        description=(spec.description + f"\n\nRuns as a durable task (estimated {spec.estimate_s:g} s): the call "
                     "returns a task id at once; follow it with get_task_status, tail_task_logs and get_task_result."),
        parameters=inline_schema(spec.input_schema), output_schema=answer_schema, handler=handler,
        default_owner=default_owner, awaited=True,
        after=after, task_config=TaskConfig(mode="optional"),
        annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=True),
        meta={"schemaVersion": spec.schema_version, "toolingVersion": TOOLING_VERSION, "async": True,
              "estimatedRuntimeSeconds": spec.estimate_s},
    )
