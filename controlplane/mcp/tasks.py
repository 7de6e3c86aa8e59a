"""Native MCP tasks (`io.modelcontextprotocol/tasks`, SEP-2663), served from our durable store.

A client that opts into the extension on a `tools/call` of a catalog tool gets the task itself
back (`resultType: "task"`), once it is committed; it then polls `tasks/get`, which inlines the
tool's result when the task is done, and may `tasks/cancel` it (our cancellation, which reaches
the cloud job). `tasks/list` lists the caller's tasks, page by page, a sweep as one. The task id is our task id:
it stays good in a fresh session and after a restart, for this caller only. A call asking for a
sweep is one task whose id is the sweep's (`controlplane.mcp.sweep_tasks`).

Our eleven states map onto the protocol's five statuses in one table (`STATUS`). A task that ended
badly (`failed`, `timed_out`) is `failed` with a JSON-RPC error whose `data` is our task error;
an `expired` task is `failed` too, its result gone.

The 2025-11-25 era has no extension negotiation. For its clients `tasks/get`, `tasks/result`,
`tasks/list` and `tasks/cancel` answer in that era's shapes (`ttl`, `pollInterval`, the result
by `tasks/result`), for tasks created through the canonical tools or the two-stage catalog
answer. Creating a task by augmenting a `tools/call` (`params.task`) is not possible on that
wire with mcp 2.3: the SDK validates every handshake-era `tools/call` result against the
2025-11-25 CallToolResult (no task arm), which strips a CreateTaskResult to nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
from fastmcp.server.extensions import MethodBinding, ServerExtension, read_client_extension_settings
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, RequestParams
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from controlplane import api, blocking
from controlplane.api import iso
from controlplane.errors import ControlPlaneError
from controlplane.guards import LimitReached
from controlplane.limits import limit_exceeded
from controlplane.mcp.progress import progress_details
from controlplane.mcp.sweep_tasks import SWEEP_META, SweepTasks, is_sweep_id
from controlplane.mcp.tools import current_caller, error
from controlplane.states import TaskState
from controlplane.store.rows import TaskRow

if TYPE_CHECKING:
    from fastmcp.server.context import Context
    from fastmcp.server.extensions import ToolCallContinuation, ToolCallOutcome

    from controlplane.app import ControlPlane

S = TaskState
# Our eleven states onto the protocol's task statuses: the one table.
STATUS: dict[TaskState, str] = {
    S.WAITING: "working",  # admitted, waiting for its parents (`after`)
    S.QUEUED: "working",
    S.SCHEDULED: "working",
    S.RUNNING: "working",
    S.CANCEL_REQUESTED: "working",  # cancellation is cooperative: still working until stopped
    S.CANCELLING: "working",
    S.SUCCEEDED: "completed",
    S.FAILED: "failed",
    S.TIMED_OUT: "failed",
    S.CANCELLED: "cancelled",
    S.EXPIRED: "failed",
}
LEGACY_STATUS = STATUS  # 2025-11-25 has the same five words (and input_required, unused here)
# A protocol method refused by a caller's limit (tasks/result's wait): a server error code of
# JSON-RPC's implementation range, with `data` the tool error's {code: LIMIT_EXCEEDED, ...}.
LIMIT_EXCEEDED_RPC = -32000


class TaskIdParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


class ListParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    cursor: str | None = None


class ControlPlaneTasks(ServerExtension):
    identifier = TASKS_EXTENSION_ID

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.sweeps = SweepTasks(cp)  # a sweep as one task (`controlplane.mcp.sweep_tasks`)

    def clone(self) -> ControlPlaneTasks:  # bound to one control plane: never deep-copied
        return ControlPlaneTasks(self.cp)

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel),
            MethodBinding("tasks/list", ListParams, self._list),
            MethodBinding("tasks/update", UpdateParams, self._update, frozenset(MODERN_PROTOCOL_VERSIONS)),
            MethodBinding("tasks/result", TaskIdParams, self._result,
                          frozenset(v for v in _handshake_versions())),
        ]

    # ---- creation: tools/call of a catalog tool -----------------------------------------------
    async def intercept_tool_call(self, params: Any, context: Context, call_next: ToolCallContinuation
                                  ) -> ToolCallOutcome:
        spec = self.cp.catalog.tool(params.name)
        rc = context.request_context
        modern = rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS
        as_task = modern and context.client_extension_settings(TASKS_EXTENSION_ID) is not None
        sweep = (rc.meta or {}).get(SWEEP_META) if rc is not None else None
        if spec is not None and sweep is not None:  # a sweep of the tool: one task, or submit_sweep's answer
            caller = current_caller(self.cp.settings.default_owner)
            return await self.sweeps.submit(caller, spec.name, dict(params.arguments or {}), sweep,  # type: ignore[return-value]
                                            as_task)
        if spec is None or not as_task:
            return await call_next()  # the two-stage answer (docs/design/two-stage-answer.md)
        caller = current_caller(self.cp.settings.default_owner)
        started = time.perf_counter()
        req = api.SubmitTask(tool_name=spec.name, inputs=dict(params.arguments or {}))
        try:
            sub = await self.cp.service.submit_grouped(caller, req)
        except ControlPlaneError as e:
            return error(e, started)  # refused before any task existed: an ordinary tool error
        task = await blocking.call(self.cp.service.get, caller, sub["task_id"])
        assert task is not None  # committed before we answer (the spec's durability rule)
        # fastmcp passes an outcome that is not a ToolResult to the wire as it is (its alias is narrower)
        return {"resultType": "task", **self._task_fields(task)}  # type: ignore[return-value]

    # ---- the task object ------------------------------------------------------------------------
    def _task_fields(self, task: TaskRow, *, legacy: bool = False) -> dict[str, Any]:
        state = TaskState(task.state)
        svc = self.cp.service
        if task.expires_at:
            ttl_ms = int((task.expires_at - task.submitted_at) * 1000)  # as applied
        else:
            ttl_ms = int(task.ttl_s) * 1000  # kept at least this long from creation
        poll_ms = svc.poll_after_ms(task)
        out: dict[str, Any] = {"taskId": task.task_id, "status": STATUS[state],
                               "createdAt": iso(task.submitted_at), "lastUpdatedAt": iso(task.updated_at)}
        if legacy:
            out.update(ttl=ttl_ms, pollInterval=poll_ms)
        else:
            out.update(ttlMs=ttl_ms, pollIntervalMs=poll_ms)
        message = self._status_message(task)
        if message:
            out["statusMessage"] = message
        return out

    def _status_message(self, task: TaskRow) -> str | None:
        err = task.error
        if err and TaskState(task.state) in (S.FAILED, S.TIMED_OUT, S.CANCELLED):
            return err.get("message")
        if task.state == S.EXPIRED:
            return "the task expired; its result was removed"
        p = task.progress
        if not p:
            return None
        percent = [f"{p['percent']:g}%"] if isinstance(p.get("percent"), int | float) else []
        return " ".join(percent + progress_details(p)) or None

    def _tool_result(self, caller: str, task: TaskRow) -> dict[str, Any]:
        """The CallToolResult a synchronous call of the tool would have returned."""
        out = self.cp.service.result(caller, api.GetTaskResult(task_id=task.task_id))
        text = json.dumps(out, separators=(",", ":"))
        # the duration (ms): for a task, how long its tool ran
        ran = (task.completed_at - task.started_at) * 1000 if task.started_at and task.completed_at else 0.0
        return {"content": [{"type": "text", "text": text}], "structuredContent": out, "isError": False,
                "_meta": {"duration": round(ran, 3)}}

    def _error(self, task: TaskRow) -> dict[str, Any]:
        err = task.error
        if task.state == S.EXPIRED:
            err = {"code": "NOT_FOUND", "message": "the task expired; its result was removed"}
        err = err or {"code": "INTERNAL", "message": f"the task ended {task.state}"}
        return {"code": INTERNAL_ERROR, "message": err.get("message", "the task failed"), "data": err}

    # ---- methods --------------------------------------------------------------------------------
    def _caller(self, ctx: ServerRequestContext[Any, Any]) -> str:
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern and read_client_extension_settings(ctx, TASKS_EXTENSION_ID) is None:
            raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                           message=f"this request targets the tasks extension ({TASKS_EXTENSION_ID}); "
                                   "the client did not declare it",
                           data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}})
        return current_caller(self.cp.settings.default_owner)

    async def _owned(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple[str, TaskRow]:
        caller = self._caller(ctx)
        task = await blocking.call(self.cp.service.get, caller, task_id)
        if task is None:  # unknown and someone else's answer alike
            raise MCPError(code=INVALID_PARAMS, message=f"task {task_id} not found")
        return caller, task

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        if is_sweep_id(params.task_id):
            legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
            return await self.sweeps.get(self._caller(ctx), params.task_id, legacy)
        caller, task = await self._owned(ctx, params.task_id)
        legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        out = self._task_fields(task, legacy=legacy)
        if legacy:
            return out  # 2025-11-25: the result comes from tasks/result
        status = out["status"]
        if status == "completed":
            out["result"] = await anyio.to_thread.run_sync(self._tool_result, caller, task)
        elif status == "failed":
            out["error"] = self._error(task)
        return {"resultType": "complete", **out}

    async def _result(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        """2025-11-25 `tasks/result`: waits for the task to end, then returns its tool result."""
        if is_sweep_id(params.task_id):
            return await self.sweeps.result(self._caller(ctx), params.task_id)
        caller, task = await self._owned(ctx, params.task_id)
        watch = self.cp.hub.watch(task.task_id, read=functools.partial(self.cp.service.get, caller, task.task_id),
                                  quiet_s=15.0)
        try:
            async with self.cp.service.streams.hold(caller, task.task_id, None), \
                    contextlib.aclosing(watch) as sightings:  # a streaming wait: the caller's streams limit
                async for seen in sightings:
                    task = seen.task or task
                    if STATUS[task.state] != "working":
                        break
        except LimitReached as e:
            err = limit_exceeded(e)
            raise MCPError(code=LIMIT_EXCEEDED_RPC, message=err.message, data=err.to_dict()) from None
        if STATUS[TaskState(task.state)] == "completed":
            return await anyio.to_thread.run_sync(self._tool_result, caller, task)
        raise MCPError(**self._error(task))

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        if is_sweep_id(params.task_id):
            legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
            return await self.sweeps.cancel(self._caller(ctx), params.task_id, legacy)
        caller, task = await self._owned(ctx, params.task_id)
        try:
            await anyio.to_thread.run_sync(self.cp.service.cancel, caller,
                                           api.CancelTask(task_id=task.task_id, reason="tasks/cancel"))
        except ControlPlaneError as e:  # a teammate's task: readable, not cancellable (FORBIDDEN)
            raise MCPError(code=INVALID_PARAMS, message=e.message, data=e.to_dict()) from None
        fresh = await blocking.call(self.cp.service.get, caller, task.task_id)
        task = fresh or task
        legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        return self._task_fields(task, legacy=True) if legacy else {"resultType": "complete"}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        await self._owned(ctx, params.task_id)
        raise MCPError(code=INVALID_PARAMS, message="this task asks for no input")

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: ListParams) -> dict[str, Any]:
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern and read_client_extension_settings(ctx, TASKS_EXTENSION_ID) is None:
            raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                           message=f"this request targets the tasks extension ({TASKS_EXTENSION_ID})",
                           data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}})
        caller = current_caller(self.cp.settings.default_owner)

        def page_of_tasks() -> tuple[list[dict[str, Any]], str | None]:
            """A sweep is one task here (its shards were never MCP tasks of the caller's): one
            entry, on one page, in place of its lowest shard."""
            page = self.cp.service.list(caller, api.ListTasks(cursor=params.cursor, limit=50, whole_sweeps=True),
                                        sweep_rows=False)
            out: list[dict[str, Any]] = []
            for t in page["tasks"]:
                if t.get("sweep"):
                    status = self.cp.service.sweep_status(caller, api.GetSweepStatus(sweep_id=t["sweep"]))
                    out.append(self.sweeps.fields(status, legacy=not modern))
                elif (row := self.cp.service.get(caller, t["task_id"])) is not None:
                    out.append(self._task_fields(row, legacy=not modern))
            return out, page["next_cursor"]

        try:
            tasks, next_cursor = await anyio.to_thread.run_sync(page_of_tasks)
        except ControlPlaneError as e:
            raise MCPError(code=INVALID_PARAMS, message=e.message) from None
        out: dict[str, Any] = {"tasks": tasks}
        if next_cursor:
            out["nextCursor"] = next_cursor
        return {"resultType": "complete", **out} if modern else out


def _handshake_versions() -> list[str]:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    return list(HANDSHAKE_PROTOCOL_VERSIONS)
