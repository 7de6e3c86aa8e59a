"""Progress notifications for one MCP request's progressToken (docs/design/progress-and-completion.md).

`ProgressSender` turns a task's updates (from the progress hub, `controlplane.progress`) into `notifications/progress` for one request's
progressToken, as MCP and docs/design/progress-and-completion.md ask: the progress value rises with
every notification (the class says how, when the task's percent does not), at most 4
notifications a second per call (later ones within the interval are coalesced into one trailing
notification that carries the newest state), and nothing after the call's terminal response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.states import FINAL, TaskState
from controlplane.store.rows import TaskRow

MIN_INTERVAL_S = 0.25  # at most 4 progress notifications per second per call
NUDGE = 1e-6  # how far a progress value rises when the task's percent has not (see ProgressSender)


def progress_details(p: dict[str, Any]) -> list[str]:
    """The words of a progress report: "step 2/4", its phase, its message (those it has)."""
    details = [f"step {p['step']}/{p['step_total']}"] if p.get("step") is not None and p.get("step_total") else []
    return details + [str(p[k]) for k in ("phase", "message") if p.get(k)]


def notification_of(task: TaskRow) -> tuple[float | None, str]:
    """(percent, message) of a task row, for a progress notification: "running: step 2/4, ..."."""
    p = task.progress or {}
    details = progress_details(p)
    percent = p.get("percent")
    return (float(percent) if isinstance(percent, int | float) else None), \
        task.state + (": " + ", ".join(details) if details else "")


def next_value(last: float | None, percent: float) -> float:
    """The progress value to send after `last` for a task at `percent`: the percent itself
    while it is above the last value, else the last value nudged up (see `ProgressSender`)."""
    if last is None or percent > last:
        return percent
    return last + NUDGE


def is_final(task: TaskRow) -> bool:
    return TaskState(task.state) in FINAL


class ProgressSender:
    """Throttled, strictly increasing progress notifications for one call's progressToken.

    MCP (2025-11-25 and 2026-07-28) says a token's progress value MUST increase with every
    notification, even when the total is unknown. A task does not oblige: its state changes
    while its percent stays put, its message changes at the same percent, a quiet spell is
    bridged by keep-alives that repeat the current state, a retry starts its percent again from
    zero, and a task may report no percent at all.

    The value sent is the task's percent, nudged: the highest percent it has reported so far
    (capped at 100; a retry's lower percents never pull it back), or, when that is not above the
    value last sent, the value last sent plus `NUDGE` (a millionth of a percent). So `progress`
    over `total` (always 100) stays the task's percent for anyone who draws a bar or prints
    "42%", and the value still rises with every notification; the message says what changed.
    A plain counter (1, 2, 3, with the percent only in the message) would satisfy the rule too,
    but then `progress/total` would mean nothing and every client that shows a bar would show
    nonsense. The nudges add up to a millionth of a percent per notification: after a day of
    keep-alives every 15 s at one percent the value is 0.006 above it. At 100 % (a tool that
    says it is done but is still writing its artifacts) the value creeps above `total` by as
    little; `progress/total` reads 100.0 % to any sensible rounding.

    Sending is serialised, and the value is chosen at the moment of sending (an update coalesced
    away by the throttle takes no value), so the values reach the client in increasing order.
    """

    def __init__(self, send: Callable[[float, float | None, str | None], Awaitable[None]],
                 min_interval_s: float = MIN_INTERVAL_S):
        self._send = send
        self.min_interval_s = min_interval_s
        self._percent = 0.0  # the highest percent the task has reported (never goes back)
        self._value: float | None = None  # the progress value last sent
        self._last_sent = 0.0
        self._message: str | None = None  # the message of the newest update
        self._unsent = False  # whether that update is still to be sent
        self._trailing: asyncio.Task[None] | None = None
        self._sending = asyncio.Lock()
        self.closed = False
        self.sent = 0

    async def update(self, percent: float | None, message: str | None) -> None:
        if self.closed:
            return
        if percent is not None:
            self._percent = max(self._percent, min(100.0, float(percent)))  # never goes back
        self._message, self._unsent = message, True
        wait = self._last_sent + self.min_interval_s - time.monotonic()
        if wait <= 0:
            await self._flush()
        elif self._trailing is None:
            self._trailing = asyncio.create_task(self._flush_after(wait))

    async def keepalive(self, message: str) -> None:
        """Repeat the current progress (a stream that stays silent for long gets cut)."""
        await self.update(None, message)

    async def _flush_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._trailing = None
        await self._flush()

    async def _flush(self) -> None:
        async with self._sending:
            if self.closed or not self._unsent:
                return
            message, self._unsent = self._message, False
            self._value = value = next_value(self._value, self._percent)
            self._last_sent = time.monotonic()
            self.sent += 1
            try:
                await self._send(value, 100.0, message)
            except Exception:  # noqa: BLE001 - the client went away: stop, the task goes on
                self.close()

    def close(self) -> None:
        """The call is over: no notification may follow its terminal response."""
        self.closed = True
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
