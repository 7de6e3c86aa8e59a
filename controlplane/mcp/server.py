"""The MCP server (fastmcp): the canonical task tools, one tool per catalog entry (swapped whole
when the catalog file changes: `controlplane.mcp.catalog_tools`), and the non-MCP HTTP routes
(runner callbacks, artifact downloads) on the same app.

The server's lifespan runs the control plane (scheduler, reconciler, and, when the MCP transport
is not HTTP, an internal HTTP listener for runners and downloads).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastmcp import FastMCP
from fastmcp.exceptions import NotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult

from controlplane import __version__, api
from controlplane.errors import invalid
from controlplane.http.routes import routes
from controlplane.mcp import compat, completion, resources
from controlplane.mcp.catalog_tools import CatalogTools, make_catalog_tool
from controlplane.mcp.guard import JsonOnly
from controlplane.mcp.oauth import build_auth
from controlplane.mcp.streaming import Followers, wait_tool
from controlplane.mcp.subscriptions import TaskSubscriptions
from controlplane.mcp.sweep_wait import wait_sweep_tool
from controlplane.mcp.tasks import ControlPlaneTasks
from controlplane.mcp.tools import canonical_tool, error
from controlplane.ops import traces
from controlplane.service import answers, uploads

if TYPE_CHECKING:
    from controlplane.app import ControlPlane

INSTRUCTIONS = """\
Runs heavy compute as durable tasks. Call a catalog tool (or submit_task) to start one: you get a
task id at once. Then use get_task_status (state, progress, ETA), tail_task_logs (cursor-paged logs),
get_task_result (result, artifact download links) and cancel_task. Tasks survive disconnects and
server restarts; keep the task id. Status and results carry what a task used and its estimated cost;
usage_report sums them. Errors are JSON {code, message, hint}."""


class UnknownToolAsError(Middleware):
    """An unknown tool name answers like every other bad request: INVALID_REQUEST (docs/design/errors-and-cancellation.md)."""

    async def on_call_tool(self, context: MiddlewareContext, call_next: CallNext) -> ToolResult:
        try:
            result: ToolResult = await call_next(context)
            return result
        except NotFoundError:
            return error(invalid(f"unknown tool '{context.message.name}'", hint="see tools/list"),
                         time.perf_counter())


class TraceSubmits(Middleware):
    """With task traces on (`controlplane.ops.traces`), a call that created a task records the
    task's submit span inside the request span fastmcp made for it, linked both ways. Installed
    only then: off, calls pass nothing more."""

    def __init__(self, submits: Callable[[str], bool]):
        self.submits = submits

    async def on_call_tool(self, context: MiddlewareContext, call_next: CallNext) -> ToolResult:
        result: ToolResult = await call_next(context)
        out = getattr(result, "structured_content", None)
        if self.submits(context.message.name) and isinstance(out, dict) and isinstance(out.get("task_id"), str) \
                and not out.get("deduplicated"):
            name = context.message.name
            tool = (context.message.arguments or {}).get("tool_name", name) if name == "submit_task" else name
            traces.submitted(out["task_id"], str(tool), str(out.get("state") or out.get("status")))
        return result


X_MCP_HEADER = "x-mcp-header"  # the 2026-07-28 schema keyword that maps an argument to a header


def header_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's Mcp-Param-* header check needs of a tool's input schema: the schema when
    it declares a header (`x-mcp-header`, operators may in a catalog tool's schema), else an empty
    object schema, which that check treats the same (nothing declared, nothing to compare). The
    check walks every position of the schema it is given, twice per call: on submit_task's schema
    that was a tenth of the call."""
    return schema if X_MCP_HEADER in json.dumps(schema) else {"type": "object"}


def build_server(cp: ControlPlane, *, with_auth: bool = True) -> FastMCP:
    followers = Followers(cp)
    subscriptions = TaskSubscriptions(cp)

    @asynccontextmanager
    async def lifespan(_server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        async with cp.running():
            try:
                yield {}
            finally:
                await subscriptions.close()
                await followers.close()

    mcp = compat.ControlPlaneMCP(
        name="mcp-controlplane",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        mask_error_details=True,
        dereference_schemas=False,  # our schemas are inlined once when the tools are built
        auth=build_auth(cp.settings, cp.public_url) if with_auth else None,
    )
    svc = cp.service
    owner = cp.settings.default_owner
    # Reads (a page of list_tasks too: a few ms of Python that would hold the GIL in a thread just
    # the same) and short writes are tried on the event loop (see controlplane.blocking);
    # get_task_result uses a thread when a link is signed by a store that may call out; a submit
    # is written on the loop when it is the only call being served, else by a group commit
    # (controlplane.group_commit) off the loop.
    tools = [
        canonical_tool("submit_task", "Submit a catalog tool to run as a durable task. Returns at once with the "
                       "task id, its queue position and when to poll. With `after`, it waits (state 'waiting') "
                       "until those tasks have succeeded.", api.SubmitTask, answers.SubmitAnswer,
                       svc.submit_grouped, default_owner=owner, read_only=False, after=followers.maybe_follow,
                       schema_version=5),  # 2: resources.scratch_mb is applied or refused; 3: no NUL (stated); 4: outputSchema; 5: `after`, state waiting
        canonical_tool("get_task_status", "State, progress (percent, step, phase, message, ETA), timing and "
                       "error of a task.", api.GetTaskStatus, answers.TaskStatus, svc.status, default_owner=owner,
                       read_only=True, inline=True, schema_version=6),  # 2: outputSchema; 3: job_id (worker_id deprecated); 4: waiting, waiting_for; 5: provider; 6: placement, moves
        canonical_tool("tail_task_logs", "Log lines of a task, page by page: pass next_cursor back to continue; "
                       "from_end=true starts at the last lines.", api.TailTaskLogs, answers.TailAnswer, svc.tail,
                       default_owner=owner, read_only=True, inline=True, schema_version=3),  # 2: outputSchema; 3: state waiting
        canonical_tool("list_tasks", "Your tasks, newest first, filtered by state, tool, tags and submission "
                       "time, with cursor pagination (an administrator's: anyone's, or everyone's).", api.ListTasks,
                       answers.TaskList, svc.list, default_owner=owner, read_only=True, inline=True,
                       schema_version=9),  # 2: `owner`; 3: no NUL; 4: `everyone`; 5: outputSchema; 6: `parent`,
        # waiting; 7: `sweep`; 8: a shard's row names its `sweep`; 9: `whole_sweeps`, a sweep's row
        canonical_tool("cancel_task", "Cancel a task: a queued or waiting task is cancelled at once; a running "
                       "one is stopped (its cloud job or process tree included). cascade=true also cancels the "
                       "tasks waiting for it. Idempotent.", api.CancelTask,
                       answers.CancelAnswer, svc.cancel, default_owner=owner, read_only=False, inline=True,
                       schema_version=4),  # 2: no NUL in reason (stated); 3: outputSchema; 4: `cascade`, waiting
        canonical_tool("get_task_result", "The result of a finished task, its artifacts with signed download "
                       "links (sha256, size, expiry) and its error, if any.", api.GetTaskResult, answers.TaskResult,
                       svc.result, default_owner=owner, read_only=True, inline=True,
                       schema_version=3),  # 2: outputSchema; 3: state waiting
        canonical_tool("usage_report", "What your tasks used (vCPU-, GiB- and GPU-seconds) and their estimated "
                       "cost at list prices, summed by tool, tag and/or owner over a period (default: this month).",
                       api.UsageReport, answers.UsageReport, svc.usage_report, default_owner=owner,
                       read_only=True, schema_version=3),  # 2: group_by's uniqueItems, no NUL in owner (stated); 3: outputSchema
        canonical_tool("create_upload", "Start uploading a file (name, exact size, sha256): answers an upload "
                       "id, its expiry and a plan saying where to send the bytes (one signed PUT, or the store's "
                       "parts or chunks for a large file). Asking again for the same file resumes it.",
                       api.CreateUpload, uploads.UploadAnswer, svc.create_upload, default_owner=owner,
                       read_only=False),
        canonical_tool("complete_upload", "Finish an upload once its bytes are sent: the server checks their size "
                       "and sha256 and answers the upload's reference (upload://...).", api.CompleteUpload,
                       uploads.CompletedUpload, svc.complete_upload, default_owner=owner, read_only=False),
        wait_tool(cp, owner),
        canonical_tool("submit_sweep", "Run one catalog tool over many inputs as one sweep: every shard is a task "
                       "whose inputs are base_inputs with its override applied (shallow). vary is "
                       '{"list": [override, ...]} (one shard per item, in order) or {"grid": {"name": [values], '
                       "...}} (one shard per combination, the first key varying slowest). Every shard is checked "
                       "like a submit and admitted together or not at all (an invalid shard refuses the sweep, "
                       "naming the shard and the field). max_parallel caps the shards running at once; fail_fast "
                       "cancels the rest after that many failed. Answers at once with the sweep id, its shard "
                       "count and the estimate of the whole.", api.SubmitSweep, answers.SweepAnswer,
                       svc.submit_sweep, default_owner=owner, read_only=False),
        canonical_tool("get_sweep_status", "A sweep as one: its shards counted by state, progress (shards ended "
                       "plus the running ones' percent), ETA, usage and cost so far, and the first failures.",
                       api.GetSweepStatus, answers.SweepStatus, svc.sweep_status, default_owner=owner,
                       read_only=True, inline=True),
        wait_sweep_tool(cp, owner),
        canonical_tool("cancel_sweep", "Cancel every shard of a sweep that has not ended (queued ones at once, "
                       "running ones stopped) and stop the sweep. Idempotent.", api.CancelSweep,
                       answers.SweepCancelAnswer, svc.cancel_sweep, default_owner=owner, read_only=False),
        canonical_tool("get_sweep_result", "A sweep's shards in shard order, page by page: each with its override, "
                       "state, result, error and artifacts with signed download links. Pass next_cursor back "
                       "to continue.", api.GetSweepResult, answers.SweepResult, svc.sweep_result,
                       default_owner=owner, read_only=True),
    ]
    # Before every 2026-07-28 tools/call with arguments, the SDK checks the request's Mcp-Param-*
    # headers against the tool's input schema, which it finds by running a whole tools/list
    # through the server unless the low-level server can look the schema up itself: that listing
    # was half the cost of a get_task_status call. Our tools are the same for every caller.
    schemas: dict[str, dict[str, Any]] = {}
    headers: dict[str, dict[str, Any]] = {}

    def schemas_changed() -> None:
        fresh = {name: header_schema(schema) for name, schema in schemas.items()}
        headers.clear()  # (one dict, changed in place on the loop: the lookup holds it)
        headers.update(fresh)

    catalog_tools = CatalogTools(mcp, cp, subscriptions, make_catalog_tool(cp, owner, followers.maybe_follow),
                                 schemas, schemas_changed)
    tools += catalog_tools.install()  # and one prompt per catalog tool
    for t in tools:
        mcp.add_tool(t)
    schemas.update({t.name: t.parameters for t in tools})
    schemas_changed()
    compat.set_input_schema_lookup(mcp, headers.get)
    mcp.add_middleware(JsonOnly(cp.catalog))  # first: past it, every value is JSON (mcp/guard.py)
    mcp.add_middleware(UnknownToolAsError())
    mcp.add_middleware(catalog_tools)  # remembers who listed tools, to tell them when they change
    if traces.enabled():
        mcp.add_middleware(TraceSubmits(lambda name: name == "submit_task" or name in cp.catalog.tools))
    mcp.add_extension(ControlPlaneTasks(cp))  # native tasks, from our own store
    resources.install(mcp, cp)  # task:// and tool://
    completion.install(mcp, cp, schemas)  # completion/complete and the tool-argument extension
    subscriptions.install(mcp)  # task:// subscriptions, in both eras

    for route in routes(cp.route_deps()):
        mcp.custom_route(route.path, methods=sorted(route.methods or []))(route.endpoint)
    return mcp
