"""Tasks and catalog tools as MCP resources (docs/design/progress-and-completion.md).

- `task://{task_id}`: the caller's task as one JSON document: its status, its result once it
  ended (with artifact links) and its last log lines. Unknown and someone else's alike answer
  "Resource not found".
- `tool://{tool_name}`: a catalog entry: description, input schema, provider (and every placement's, in
  order), limits, estimate.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import ValidationError

from controlplane import api
from controlplane.errors import ControlPlaneError
from controlplane.mcp.tools import current_caller
from controlplane.states import TERMINAL, TaskState

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane

TASK_TEMPLATE = "task://{task_id}"
TOOL_TEMPLATE = "tool://{tool_name}"
RESOURCE_LOG_LINES = 50


def not_found(uri: str) -> MCPError:
    """What fastmcp answers for an unknown resource (SEP-2164), raised from inside a template."""
    return MCPError(code=INVALID_PARAMS, message=f"Resource not found: {uri!r}", data={"uri": uri})


# ---- resources -------------------------------------------------------------------------------
def task_document(cp: ControlPlane, caller: str, task_id: str) -> str:
    """The task as one JSON document: status, result (once it ended), the last log lines."""
    svc = cp.service
    try:
        ref = api.GetTaskStatus(task_id=task_id)
        status = svc.status(caller, ref)
        logs = svc.tail(caller, api.TailTaskLogs(task_id=task_id, from_end=True, limit=RESOURCE_LOG_LINES))
    except (ValidationError, ControlPlaneError) as e:
        if isinstance(e, ControlPlaneError) and e.code.value != "NOT_FOUND":
            raise MCPError(code=INVALID_PARAMS, message=e.message) from None
        raise not_found(f"task://{task_id}") from None  # unknown and someone else's alike
    result: dict[str, Any] | None = None
    if TaskState(status["state"]) in TERMINAL or status["state"] == TaskState.EXPIRED:
        try:
            result = svc.result(caller, api.GetTaskResult(task_id=task_id))
        except ControlPlaneError as e:
            result = {"error": e.to_dict()}
    return json.dumps({"status": status, "result": result, "logs": logs}, separators=(",", ":"))


def tool_document(cp: ControlPlane, tool_name: str) -> str:
    spec = cp.catalog.tool(tool_name)
    if spec is None:
        raise not_found(f"tool://{tool_name}")
    return json.dumps({"name": spec.name, "description": spec.description, "schemaVersion": spec.schema_version,
                       "inputSchema": spec.input_schema, "provider": spec.provider,
                       "placements": [p.provider for p in spec.each_placement()],
                       "resourceClass": spec.resource_class, "defaultRuntimeSeconds": spec.default_runtime_s,
                       "maxRuntimeSeconds": spec.max_runtime_s,
                       "estimatedRuntimeSeconds": cp.service.estimator.estimate(spec, None)},
                      separators=(",", ":"))


def install(mcp: FastMCP, cp: ControlPlane) -> None:
    owner_default = cp.settings.default_owner

    @mcp.resource(TASK_TEMPLATE, name="task", mime_type="application/json",
                  description="One of your tasks: its status (state, progress, ETA), its result once it ended "
                              f"(with artifact links) and its last {RESOURCE_LOG_LINES} log lines.")
    async def task_resource(task_id: str) -> str:
        return await anyio.to_thread.run_sync(task_document, cp, current_caller(owner_default), task_id)

    @mcp.resource(TOOL_TEMPLATE, name="catalog_tool", mime_type="application/json",
                  description="A tool of the catalog: description, input schema, provider, limits and the "
                              "runtime estimate from its history.")
    async def tool_resource(tool_name: str) -> str:
        return await anyio.to_thread.run_sync(tool_document, cp, tool_name)
