"""Following a sweep as one (docs/design/sweeps.md, "Waiting for a sweep").

* `follow_sweep`: the sweep's aggregate (`get_sweep_status`'s answer) each time one of its shards
  changes, read at most 4 times a second however many shards change (changes in between coalesce
  into the next read), and after each quiet spell; forwarded to a `ProgressSender` as the sweep's
  percent and a line of counts. Never reads the shards themselves.
* `wait_sweep` (a canonical tool): holds the call open until every shard has ended or
  `timeout_s` passes, streaming that progress for the request's progressToken, and answers the
  sweep's status (`answers.SweepWaitAnswer`). Leaving early never cancels the sweep; a client
  that cancels the wait gets one answer, CANCELLED, and the sweep goes on (`waiting.WaitingTool`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
from mcp_types import ToolAnnotations
from pydantic import BaseModel

from controlplane import api, blocking
from controlplane.mcp.progress import MIN_INTERVAL_S, ProgressSender
from controlplane.mcp.tools import TOOLING_VERSION, inline_schema, output_schema
from controlplane.mcp.waiting import WaitingTool
from controlplane.service.answers import SweepWaitAnswer

if TYPE_CHECKING:
    from controlplane.app import ControlPlane

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


class WaitSweepTool(WaitingTool):
    """wait_sweep: waits for a sweep, streaming its aggregated progress."""

    request: ClassVar[type[BaseModel]] = api.WaitSweep
    what: ClassVar[str] = "sweep"

    def watched(self, req: api.WaitSweep) -> str:
        return req.sweep_id

    async def check(self, caller: str, req: api.WaitSweep) -> None:
        await blocking.call(self.cp.service.sweep_status, caller, api.GetSweepStatus(sweep_id=req.sweep_id))

    async def follow(self, caller: str, req: api.WaitSweep, sender: ProgressSender, until: float) -> dict[str, Any]:
        return await follow_sweep(self.cp, caller, req.sweep_id, sender, until)

    async def answer(self, caller: str, req: api.WaitSweep, seen: dict[str, Any]) -> dict[str, Any]:
        if seen["done"]:
            return SweepWaitAnswer.model_validate({"done": True, "status": seen}).dump()
        message = (f"the sweep is still running after {req.timeout_s:g} s ({sweep_message(seen)}); call "
                   "wait_sweep again or poll get_sweep_status")
        return SweepWaitAnswer.model_validate({"done": False, "message": message, "status": seen}).dump()


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
