"""A sweep as one native MCP task (docs/design/sweeps.md, "A sweep as one MCP task").

A `tools/call` of a catalog tool whose `_meta` carries `SWEEP_META` (`{"vary": ..., and any of
submit_sweep's max_parallel, fail_fast, priority, tags, idempotency_key, ttl_s}`) submits a sweep
of that tool, its arguments the shards' base inputs. A client speaking the 2026-07-28 tasks
extension gets the sweep back as one task (its id the sweep's, `swp_...`); any other client gets
submit_sweep's answer as the call's result. `tasks/get` answers the sweep's aggregate as the
task's status message and, once every shard has ended, the first page of get_sweep_result (with
the sweep's status) as its result; `tasks/cancel` cancels the sweep; the 2025-11-25 `tasks/get`,
`tasks/result` and `tasks/cancel` answer the same for a sweep id.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import ValidationError

from controlplane import api, blocking
from controlplane.api import iso
from controlplane.errors import ControlPlaneError, invalid
from controlplane.mcp.progress import ProgressSender
from controlplane.mcp.sweep_wait import follow_sweep, sweep_message
from controlplane.mcp.tools import describe_validation_error, error, ok

if TYPE_CHECKING:
    from fastmcp.tools.base import ToolResult

    from controlplane.app import ControlPlane

SWEEP_META = "io.github.mcp-controlplane/sweep"
RESULT_PAGE = 50  # shards in a sweep task's result (get_sweep_result's default page)


def is_sweep_id(task_id: str) -> bool:
    return task_id.startswith("swp_")


class SweepTasks:
    def __init__(self, cp: ControlPlane):
        self.cp = cp

    # ---- creation -------------------------------------------------------------------------------
    async def submit(self, caller: str, tool_name: str, arguments: dict[str, Any], meta: Any,
                     as_task: bool) -> ToolResult | dict[str, Any]:
        """Submit the sweep a catalog call asks for: the task itself (committed) when `as_task`,
        else submit_sweep's answer as the call's result. Bad input: a tool error, nothing written."""
        started = time.perf_counter()
        try:
            if not isinstance(meta, dict):
                raise invalid(f"_meta {SWEEP_META} must be an object with a vary",
                              hint='e.g. {"vary": {"list": [{...}, ...]}}')
            if "tool_name" in meta or "base_inputs" in meta:
                raise invalid(f"_meta {SWEEP_META}: the tool is the one called, its arguments the base inputs")
            try:
                req = api.SubmitSweep.model_validate({**meta, "tool_name": tool_name, "base_inputs": arguments})
            except ValidationError as e:
                raise describe_validation_error(e) from None
            answer = await anyio.to_thread.run_sync(self.cp.service.submit_sweep, caller, req)
            if not as_task:
                return ok(answer, started)
            status = await blocking.call(self._status, caller, answer["sweep_id"])
        except ControlPlaneError as e:
            return error(e, started)  # refused before any shard existed: an ordinary tool error
        return {"resultType": "task", **self.fields(status)}

    # ---- the task object ------------------------------------------------------------------------
    def _status(self, caller: str, sweep_id: str) -> dict[str, Any]:
        return self.cp.service.sweep_status(caller, api.GetSweepStatus(sweep_id=sweep_id))

    async def status(self, caller: str, sweep_id: str) -> dict[str, Any]:
        """The caller's sweep's status; INVALID_PARAMS "not found" as for a task (theirs alike)."""
        try:
            return await blocking.call(self._status, caller, sweep_id)
        except ControlPlaneError:
            raise MCPError(code=INVALID_PARAMS, message=f"task {sweep_id} not found") from None

    def fields(self, status: dict[str, Any], *, legacy: bool = False) -> dict[str, Any]:
        """The protocol's task object of a sweep (its status message the aggregate)."""
        done = status["done"]
        if not done:
            word = "working"
        elif (status["stop_reason"] or "").startswith("was cancelled"):
            word = "cancelled"
        else:
            word = "completed"  # with isError when a shard did not succeed (the results say which)
        ttl_ms = self.cp.settings.default_ttl_s * 1000
        poll_ms = status["poll_after_ms"] or 1000
        out: dict[str, Any] = {"taskId": status["sweep_id"], "status": word, "createdAt": status["submitted_at"],
                               "lastUpdatedAt": status["stopped_at"] if done and status["stopped_at"]
                               else iso(time.time())}  # the aggregate moves with every shard
        out.update({"ttl": ttl_ms, "pollInterval": poll_ms} if legacy else {"ttlMs": ttl_ms, "pollIntervalMs": poll_ms})
        reason = f" ({status['stop_reason']})" if status["stop_reason"] else ""
        out["statusMessage"] = f"{status['percent']:g}% {sweep_message(status)}{reason}"
        return out

    def tool_result(self, caller: str, status: dict[str, Any]) -> dict[str, Any]:
        """The sweep's result as a CallToolResult: its status and the first page of its shards'
        results (get_sweep_result's; its next_cursor pages on)."""
        page = self.cp.service.sweep_result(caller, api.GetSweepResult(sweep_id=status["sweep_id"],
                                                                       limit=RESULT_PAGE))
        out = {"status": status, **page}
        failed = status["counts"] != {"succeeded": status["shards"]}
        return {"content": [{"type": "text", "text": json.dumps(out, separators=(",", ":"))}],
                "structuredContent": out, "isError": failed}

    # ---- methods --------------------------------------------------------------------------------
    async def get(self, caller: str, sweep_id: str, legacy: bool) -> dict[str, Any]:
        status = await self.status(caller, sweep_id)
        out = self.fields(status, legacy=legacy)
        if not legacy and out["status"] == "completed":
            out["result"] = await anyio.to_thread.run_sync(self.tool_result, caller, status)
        return out if legacy else {"resultType": "complete", **out}

    async def result(self, caller: str, sweep_id: str) -> dict[str, Any]:
        """2025-11-25 `tasks/result`: waits for every shard to end, then the sweep's result."""
        await self.status(caller, sweep_id)
        status = await follow_sweep(self.cp, caller, sweep_id, ProgressSender(_discard), float("inf"))
        if self.fields(status)["status"] == "cancelled":
            raise MCPError(code=INVALID_PARAMS, message=f"sweep {sweep_id} {status['stop_reason']}")
        return await anyio.to_thread.run_sync(self.tool_result, caller, status)

    async def cancel(self, caller: str, sweep_id: str, legacy: bool) -> dict[str, Any]:
        await self.status(caller, sweep_id)
        try:
            await anyio.to_thread.run_sync(self.cp.service.cancel_sweep, caller,
                                           api.CancelSweep(sweep_id=sweep_id, reason="tasks/cancel"))
        except ControlPlaneError as e:  # a teammate's sweep: readable, not cancellable (FORBIDDEN)
            raise MCPError(code=INVALID_PARAMS, message=e.message, data=e.to_dict()) from None
        return self.fields(await self.status(caller, sweep_id), legacy=True) if legacy else {"resultType": "complete"}


async def _discard(progress: float, total: float | None, message: str | None) -> None:
    return None
