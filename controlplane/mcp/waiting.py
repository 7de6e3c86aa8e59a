"""The wait tools' common call (docs/design/streaming.md, "Waiting").

`WaitingTool.run` is what wait_task and wait_sweep share: the caller, the strict parse of the
arguments (INVALID_REQUEST naming the field), a first read (NOT_FOUND for what the caller may not
read), the request's progress sender, the caller's streams limit held for the wait, the answer
CANCELLED to a client that cancels the wait with `notifications/cancelled` (once, after any
progress, on every wire that can carry it; `compat.CancelledWaitAnswer`), and the error mapping.
A subclass says what it waits for: `request` (its arguments' model), `watched` (the id it
follows), `follow` (what to read until it is done, as a `ProgressSender` sees it) and `answer`
(what the call returns once the wait ended or gave up). Waiting never changes what is waited for.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, ClassVar

import anyio
from fastmcp.server.dependencies import get_context
from fastmcp.tools.base import Tool, ToolResult
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import SkipJsonSchema

from controlplane.errors import ControlPlaneError, ErrorCode
from controlplane.guards import LimitReached
from controlplane.limits import limit_exceeded
from controlplane.mcp.compat import CancelledWaitAnswer
from controlplane.mcp.progress import ProgressSender
from controlplane.mcp.tools import current_caller, describe_validation_error, error, ok

log = logging.getLogger("controlplane.mcp.waiting")


def progress_sender_for_request() -> ProgressSender | None:
    """A sender bound to the current request's progressToken (None without one)."""
    ctx = get_context()
    rc = ctx.request_context
    token = (rc.meta or {}).get("progressToken") if rc is not None else None
    if token is None or rc is None:
        return None
    session, request_id = rc.session, rc.request_id

    async def send(progress: float, total: float | None, message: str | None) -> None:
        await session.send_progress_notification(progress_token=token, progress=progress, total=total,
                                                 message=message, related_request_id=request_id)
    return ProgressSender(send)


class WaitingTool(Tool):
    """A tool that holds its call open while something advances, streaming its progress."""

    cp: SkipJsonSchema[Any]
    default_owner: SkipJsonSchema[str] = "local"
    request: ClassVar[type[BaseModel]]
    what: ClassVar[str]  # "task", "sweep": named in the CANCELLED answer

    def watched(self, req: Any) -> str:
        """The id of what `req` waits for."""
        raise NotImplementedError

    async def check(self, caller: str, req: Any) -> None:
        """Raise NOT_FOUND unless the caller may read what `req` waits for."""
        raise NotImplementedError

    async def follow(self, caller: str, req: Any, sender: ProgressSender, until: float) -> Any:
        """Stream progress to `sender` until what `req` waits for is done or `until` (monotonic)
        passes; returns it as last read."""
        raise NotImplementedError

    async def answer(self, caller: str, req: Any, seen: Any) -> dict[str, Any]:
        """The call's answer for what was last read (done, or still going after the timeout)."""
        raise NotImplementedError

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        started = time.perf_counter()
        caller = current_caller(self.default_owner)
        try:
            req: Any = self.request.model_validate_json(json.dumps(arguments))
        except ValidationError as e:
            return error(describe_validation_error(e), started)
        watched: str = self.watched(req)
        try:
            await self.check(caller, req)
            sender = progress_sender_for_request() or ProgressSender(discard)  # nobody to stream to: wait quietly
            answer_if_cancelled = CancelledWaitAnswer.for_request()
            try:
                async with self.cp.service.streams.hold(caller, watched, req.timeout_s):  # the caller's streams limit
                    seen = await self.follow(caller, req, sender, time.monotonic() + req.timeout_s)
            except anyio.get_cancelled_exc_class():
                sender.close()  # nothing after the answer, which follows
                if answer_if_cancelled is not None and answer_if_cancelled.requested:
                    with anyio.move_on_after(5, shield=True):
                        await answer_if_cancelled.send(error(self.cancelled(watched), started))
                raise
            finally:
                sender.close()  # no progress after the terminal answer
            out = await self.answer(caller, req, seen)
        except ControlPlaneError as e:
            return error(e, started)
        except LimitReached as e:
            return error(limit_exceeded(e), started)
        except Exception:
            log.exception("%s failed", self.name)
            return error(ControlPlaneError(ErrorCode.INTERNAL, "internal error; the server log has the details"),
                         started)
        return ok(out, started)

    def cancelled(self, watched: str) -> ControlPlaneError:
        """The answer to a wait its client cancelled: what it waited for goes on."""
        return ControlPlaneError(
            ErrorCode.CANCELLED, f"the wait was cancelled; the {self.what} was not, and goes on",
            hint=f"get_{self.what}_status or wait_{self.what} follow it; cancel_{self.what} stops it",
            **{f"{self.what}_id": watched})


async def discard(progress: float, total: float | None, message: str | None) -> None:
    return None
