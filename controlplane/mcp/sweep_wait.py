"""Following a sweep as one (docs/design/sweeps.md, "Waiting for a sweep").

* `follow_sweep`: the sweep's aggregate (`get_sweep_status`'s answer) each time one of its shards
  changes, read at most 4 times a second however many shards change (changes in between coalesce
  into the next read), and after each quiet spell; forwarded to a `ProgressSender` as the sweep's
  percent and a line of counts. Never reads the shards themselves.
* `wait_sweep` (a canonical tool): holds the call open until every shard has ended or
  `timeout_s` passes, streaming that progress for the request's progressToken, and answers the
  sweep's status (`answers.SweepWaitAnswer`). Leaving early never cancels the sweep.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
from fastmcp.tools.base import Tool, ToolResult
from mcp_types import ToolAnnotations
from pydantic import ValidationError
from pydantic.json_schema import SkipJsonSchema

from controlplane import api, blocking
from controlplane.errors import ControlPlaneError, ErrorCode
from controlplane.guards import LimitReached
from controlplane.limits import limit_exceeded
from controlplane.mcp.progress import MIN_INTERVAL_S, ProgressSender
from controlplane.mcp.streaming import progress_sender_for_request
from controlplane.mcp.tools import (
    TOOLING_VERSION,
    current_caller,
    describe_validation_error,
    error,
    inline_schema,
    ok,
    output_schema,
)
from controlplane.service.answers import SweepWaitAnswer

if TYPE_CHECKING:
    from controlplane.app import ControlPlane

log = logging.getLogger("controlplane.mcp.sweep_wait")


def sweep_message(status: dict[str, Any]) -> str:
    """A sweep's aggregate in words: "7/20 shards ended: 6 succeeded, 1 failed; 4 running"."""
    counts: dict[str, int] = status["counts"]
    ended = ", ".join(f"{n} {s}" for s, n in counts.items() if s in ("succeeded", "failed", "timed_out",
                                                                        "cancelled", "expired"))
    running = counts.get("running", 0)
    return (f"{status['ended']}/{status['shards']} shards ended" + (f": {ended}" if ended else "")
            + (f"; {running} running" if running else ""))


def _shown(status: dict[str, Any]) -> tuple[Any, ...]:
    return status["percent"], tuple(sorted(status["counts"].items()))


async def follow_sweep(cp: ControlPlane, caller: str, sweep_id: str, sender: ProgressSender,
                       until: float) -> dict[str, Any]:
    """Forward the caller's sweep's aggregated progress to `sender` until every shard has ended or
    `until` (monotonic) passes; returns its status as last read. NOT_FOUND for a sweep the caller
    may not read. Subscribes before the first read, so no shard's change slips in between."""
    keepalive_s = cp.settings.keepalive_s
    read = lambda: cp.service.sweep_status(caller, api.GetSweepStatus(sweep_id=sweep_id))  # noqa: E731
    with cp.hub.subscribe(sweep_id) as sub:
        status = await blocking.call(read)
        last_read = last_sent = time.monotonic()
        await sender.update(status["percent"], sweep_message(status))
        while not status["done"] and time.monotonic() < until:
            spell = min(keepalive_s, max(0.0, until - time.monotonic()))
            await sub.next(timeout=spell)  # a shard changed, or a quiet spell passed
            await anyio.sleep(max(0.0, last_read + MIN_INTERVAL_S - time.monotonic()))  # throttled reads
            fresh = await blocking.call(read)
            last_read = time.monotonic()
            if fresh["done"]:
                status = fresh
                break
            if _shown(fresh) != _shown(status):
                await sender.update(fresh["percent"], sweep_message(fresh))
                last_sent = time.monotonic()
            elif last_read - last_sent >= keepalive_s:
                await sender.keepalive(sweep_message(fresh))
                last_sent = time.monotonic()
            status = fresh
    return status


class WaitSweepTool(Tool):
    """wait_sweep: waits for a sweep, streaming its aggregated progress."""

    cp: SkipJsonSchema[Any]
    default_owner: SkipJsonSchema[str] = "local"

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        started = time.perf_counter()
        caller = current_caller(self.default_owner)
        try:
            req = api.WaitSweep.model_validate_json(json.dumps(arguments))
        except ValidationError as e:
            return error(describe_validation_error(e), started)
        svc = self.cp.service
        sender = progress_sender_for_request() or ProgressSender(_discard)
        try:
            await blocking.call(svc.sweep_status, caller, api.GetSweepStatus(sweep_id=req.sweep_id))  # NOT_FOUND
            try:
                async with svc.streams.hold(caller, req.sweep_id, req.timeout_s):  # the caller's streams limit
                    status = await follow_sweep(self.cp, caller, req.sweep_id, sender,
                                                time.monotonic() + req.timeout_s)
            finally:
                sender.close()  # no progress after the terminal answer
        except ControlPlaneError as e:
            return error(e, started)
        except LimitReached as e:
            return error(limit_exceeded(e), started)
        except Exception:
            log.exception("wait_sweep failed")
            return error(ControlPlaneError(ErrorCode.INTERNAL, "internal error; the server log has the details"),
                         started)
        if status["done"]:
            return ok(SweepWaitAnswer.model_validate({"done": True, "status": status}).dump(), started)
        message = (f"the sweep is still running after {req.timeout_s:g} s ({sweep_message(status)}); call "
                   "wait_sweep again or poll get_sweep_status")
        return ok(SweepWaitAnswer.model_validate({"done": False, "message": message, "status": status}).dump(),
                  started)


async def _discard(progress: float, total: float | None, message: str | None) -> None:
    return None


def wait_sweep_tool(cp: ControlPlane, default_owner: str) -> WaitSweepTool:
    return WaitSweepTool(
        name="wait_sweep",
        description=("Wait for a sweep to end, up to timeout_s, streaming its aggregated progress (shards ended "
                     "plus the running ones' percent) as notifications/progress for your progressToken, at most 4 "
                     "a second. Returns the sweep's status (get_sweep_status), with done=false if it is still "
                     "running. Leaving early never cancels the sweep."),
        parameters=inline_schema(api.WaitSweep.model_json_schema()), output_schema=output_schema(SweepWaitAnswer),
        cp=cp, default_owner=default_owner,
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False),
        meta={"schemaVersion": 1, "toolingVersion": TOOLING_VERSION},
    )
