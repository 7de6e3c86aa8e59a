"""Streaming a task's progress to a connected client (docs/design/streaming.md).

* `wait_task` (a canonical tool): holds the call open until the task ends or `timeout_s` passes,
  sending `notifications/progress` for the request's progressToken as the task advances. Over
  HTTP the answer streams as SSE, which the transport keeps alive with a comment every 15 s; a
  client that goes away only ends the wait, never the task, which stays reachable by id (the
  polling fallback). It returns the task's result, or a "still running" answer with the
  latest status (`answers.WaitAnswer`, its outputSchema). A client that cancels the wait (`notifications/cancelled`) gets one answer,
  CANCELLED, and the task goes on (docs/design/errors-and-cancellation.md; see `CancelledWaitAnswer`).
* The two-stage answer (docs/design/two-stage-answer.md): a catalog tool (or submit_task) called with a progressToken
  and `_meta["io.github.mcp-controlplane/notify"] = true` answers at once with the task id, then,
  while the client's session lasts, keeps sending `notifications/progress` for that token and
  ends with a `notifications/tool_result` carrying the task's result. This needs a channel that
  outlives the call: stdio, or a 2025-11-25 HTTP session (the 2026-07-28 wire has none; its
  clients use native tasks or wait_task).

Progress notifications are monotonic, at most 4 per second per call, and none follows the
terminal answer (`controlplane.mcp.progress.ProgressSender`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fastmcp.server.dependencies import get_context
from mcp_types import ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from controlplane import api, blocking
from controlplane.errors import not_found
from controlplane.mcp.progress import ProgressSender, is_final, notification_of
from controlplane.mcp.tools import TOOLING_VERSION, inline_schema, output_schema
from controlplane.mcp.waiting import WaitingTool, discard, progress_sender_for_request
from controlplane.service import answers
from controlplane.store.rows import TaskRow

__all__ = ["NOTIFY_META", "Followers", "WaitTool", "follow", "progress_sender_for_request", "wait_tool"]

if TYPE_CHECKING:
    from controlplane.app import ControlPlane

log = logging.getLogger("controlplane.mcp.streaming")
NOTIFY_META = "io.github.mcp-controlplane/notify"


async def follow(cp: ControlPlane, caller: str, task_id: str, sender: ProgressSender, until: float) -> TaskRow:
    """Forward the caller's task's progress to `sender` until it ends or `until` (monotonic)
    passes; returns the task as last seen. Never cancels the task."""
    keepalive_s = cp.settings.keepalive_s
    task: TaskRow | None = None
    last_sent = time.monotonic()
    watch = cp.hub.watch(task_id, read=functools.partial(cp.service.get, caller, task_id),
                         quiet_s=lambda: min(keepalive_s, max(0.0, until - time.monotonic())))
    async with contextlib.aclosing(watch) as sightings:
        async for seen in sightings:
            if task is None:  # the first sighting: the task as it is now
                if seen.task is None:
                    raise not_found()
                task = seen.task
                await sender.update(*notification_of(task))
            elif seen.quiet and (seen.task is None or _shown(seen.task) == _shown(task)):
                if time.monotonic() - last_sent >= keepalive_s:
                    await sender.keepalive(notification_of(task)[1])
                    last_sent = time.monotonic()
            else:
                task = seen.task
                if not is_final(task):
                    await sender.update(*notification_of(task))
                    last_sent = time.monotonic()
            if is_final(task) or time.monotonic() >= until:
                break
    assert task is not None
    return task


def _shown(task: TaskRow) -> tuple[str, str | None]:
    """What a follower shows of a task: its state and its progress."""
    return task.state, task.progress_json


class WaitTool(WaitingTool):
    """wait_task: waits for a task, streaming its progress."""

    request: ClassVar[type[BaseModel]] = api.WaitTask
    what: ClassVar[str] = "task"

    def watched(self, req: api.WaitTask) -> str:
        return req.task_id

    async def check(self, caller: str, req: api.WaitTask) -> None:
        if await blocking.call(self.cp.service.get, caller, req.task_id) is None:
            raise not_found()

    async def follow(self, caller: str, req: api.WaitTask, sender: ProgressSender, until: float) -> TaskRow:
        return await follow(self.cp, caller, req.task_id, sender, until)

    async def answer(self, caller: str, req: api.WaitTask, seen: TaskRow) -> dict[str, Any]:
        out: dict[str, Any] = self.cp.service.waited(caller, seen, req.timeout_s)
        return out


def wait_tool(cp: ControlPlane, default_owner: str) -> WaitTool:
    return WaitTool(
        name="wait_task",
        description=("Wait for a task to finish, up to timeout_s, streaming its progress (notifications/progress "
                     "for your progressToken). Returns the result like get_task_result, or done=false with the "
                     "latest status if it is still running. Leaving early never cancels the task."),
        parameters=inline_schema(api.WaitTask.model_json_schema()), output_schema=output_schema(answers.WaitAnswer),
        cp=cp, default_owner=default_owner,
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False),
        meta={"schemaVersion": 6, "toolingVersion": TOOLING_VERSION},  # 2: outputSchema; 3: status.job_id; 4: waiting; 5: status.provider; 6: status.placement, moves
    )


# ---- the two-stage answer's later stages -----------------------------------------------
class ToolResultNotification(BaseModel):
    """The two-stage answer's final notification, after the immediate answer and the progress notifications."""

    method: Literal["notifications/tool_result"] = "notifications/tool_result"
    params: dict[str, Any]


class Followers:
    """Background followers: each streams one task to one client session, then says goodbye."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self._tasks: set[asyncio.Task[None]] = set()

    def maybe_follow(self, caller: str, out: dict[str, Any]) -> None:
        """Called by a task-creating tool after it answered: follow the task if the client asked."""
        try:
            ctx = get_context()
        except RuntimeError:
            return
        rc = ctx.request_context
        meta = (rc.meta or {}) if rc is not None else {}
        if rc is None or not meta.get(NOTIFY_META) or rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        token, session = meta.get("progressToken"), rc.session
        task = asyncio.create_task(self._follow(caller, out["task_id"], token, session))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self, caller: str, task_id: str, token: Any, session: Any) -> None:
        async def send(progress: float, total: float | None, message: str | None) -> None:
            await session.send_progress_notification(progress_token=token, progress=progress, total=total,
                                                     message=message)  # the session's own channel

        sender = ProgressSender(send if token is not None else discard)
        try:
            task = await follow(self.cp, caller, task_id, sender, float("inf"))
            sender.close()
            result = await asyncio.to_thread(self.cp.service.result, caller, api.GetTaskResult(task_id=task_id))
            await session.send_notification(ToolResultNotification(params={
                "job_id": task_id, "task_id": task_id, "result": result,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "state": task.state}))
        except Exception as e:  # noqa: BLE001 - the session ended: the task goes on, by id
            log.debug("stopped following %s: %r", task_id, e)
        finally:
            sender.close()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
