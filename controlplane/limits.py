"""Limits per caller: submits per minute and per day, tasks in flight, streaming waits open.

Defaults come from the settings (`CONTROLPLANE_LIMIT_*`, all off unless set); an operator
overrides them per caller with `controlplane limits set` (the `caller_limits` table: NULL keeps
the default, -1 lifts the limit, 0 refuses every submit or stream). The overrides are read once
at start and then every `CONTROLPLANE_LIMITS_REFRESH_S` (30 s) by the control plane's loop, never
on a call: a call reads the database for a limit only when its caller has one.

The limits hold across replicas because they are counted in the shared database, in the
transaction that would write what they limit, by their guards (`controlplane.guards`): submits
and tasks in flight from the caller's tasks (`CallerLimits`, in the submit's own transaction, so
a refused submit writes nothing and uses no idempotency key), streams from `caller_streams`
(`OpenStreams`).
Sliding windows: "10 per minute" is at most 10 in any 60 seconds, and the refusal says when the
oldest of them leaves the window (`retry_after_s`).

This replaces nothing: `providers/ratelimit.py` is the client-side limiter of the cloud APIs
(requests per second this process sends to one service), in memory by design; limits per
caller must hold across processes, so they live in the database.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.to_thread

from controlplane.errors import ControlPlaneError, ErrorCode
from controlplane.guards import CallerLimits, LimitReached, OpenStreams
from controlplane.settings import Settings
from controlplane.store import Store
from controlplane.store.rows import CallerLimitsRow

log = logging.getLogger("controlplane.limits")
UNLIMITED = -1

DESCRIBE = {
    "submits_per_minute": "{n} submits per minute",
    "submits_per_day": "{n} submits per day",
    "tasks_in_flight": "{n} tasks in flight",
    "streams": "{n} streaming waits open at once",
}
HINTS = {
    "submits_per_minute": "wait retry_after_s seconds before submitting again",
    "submits_per_day": "wait retry_after_s seconds before submitting again",
    "tasks_in_flight": "wait for one of your tasks to end (wait_task, get_task_status), or cancel one",
    "streams": "end one of your open waits, or poll get_task_status instead",
}


@dataclass(frozen=True)
class Effective:
    """A caller's limits after overrides (None: no limit of that kind)."""

    submits_per_minute: int | None = None
    submits_per_day: int | None = None
    tasks_in_flight: int | None = None
    streams: int | None = None


def _pick(override: int | None, default: int | None) -> int | None:
    if override is None:
        return default
    return None if override < 0 else override


class Limits:
    def __init__(self, settings: Settings, store: Store):
        self.store = store
        self.defaults = Effective(settings.limit_submits_per_minute, settings.limit_submits_per_day,
                                  settings.limit_tasks_in_flight, settings.limit_streams)
        self._overrides: dict[str, CallerLimitsRow] = {}
        self._default_submit = self._submit_limits(self.defaults)

    def refresh(self) -> None:
        """Read the operators' overrides again (a short read; the loop calls it)."""
        self._overrides = {r.owner: r for r in self.store.callers.overrides()}

    def of(self, caller: str) -> Effective:
        row = self._overrides.get(caller)
        if row is None:
            return self.defaults
        d = self.defaults
        return Effective(_pick(row.submits_per_minute, d.submits_per_minute),
                         _pick(row.submits_per_day, d.submits_per_day),
                         _pick(row.tasks_in_flight, d.tasks_in_flight), _pick(row.streams, d.streams))

    def for_submit(self, caller: str) -> CallerLimits | None:
        """The guard a submit of `caller` passes, or None (then it reads nothing for limits)."""
        if not self._overrides or caller not in self._overrides:
            return self._default_submit
        return self._submit_limits(self.of(caller))

    def streams(self, caller: str) -> int | None:
        if caller not in self._overrides:
            return self.defaults.streams
        return self.of(caller).streams

    @staticmethod
    def _submit_limits(e: Effective) -> CallerLimits | None:
        if e.submits_per_minute is None and e.submits_per_day is None and e.tasks_in_flight is None:
            return None
        return CallerLimits(e.submits_per_minute, e.submits_per_day, e.tasks_in_flight)


class Streams:
    """Streaming waits held against their caller's limit (`hold`), in the database so that every
    replica counts them. Costs nothing for a caller without a streams limit."""

    MARGIN_S = 30.0  # a wait's row outlives its timeout by this much (a server that died frees it then)
    OPEN_ENDED_S = 120.0  # a wait without a timeout (2025-11-25 tasks/result) renews its row this often

    def __init__(self, limits: Limits, store: Store):
        self.limits = limits
        self.store = store

    @asynccontextmanager
    async def hold(self, caller: str, task_id: str, duration_s: float | None) -> AsyncIterator[None]:
        """One stream of `caller` open for the block (at most `duration_s`; None: until it ends).
        Raises LimitReached when the caller has `limit` open already, on any replica."""
        limit = self.limits.streams(caller)
        if limit is None:
            yield
            return
        callers = self.store.callers
        hold_s = (duration_s + self.MARGIN_S) if duration_s is not None else self.OPEN_ENDED_S
        stream_id = await anyio.to_thread.run_sync(callers.open_stream, str(caller), task_id, hold_s,
                                                   OpenStreams(limit))
        try:
            if duration_s is not None:
                yield
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._renew, stream_id)
                    try:
                        yield
                    finally:
                        tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(callers.close_stream, stream_id)

    async def _renew(self, stream_id: str) -> None:
        while True:
            await anyio.sleep(self.OPEN_ENDED_S / 2)
            try:
                await anyio.to_thread.run_sync(self.store.callers.renew_stream, stream_id, self.OPEN_ENDED_S)
            except Exception:  # noqa: BLE001 - the next renewal tries again; the row frees itself meanwhile
                log.warning("renewing stream %s failed", stream_id, exc_info=True)


def limit_exceeded(e: LimitReached) -> ControlPlaneError:
    """The client's answer to a refusal: LIMIT_EXCEEDED naming the limit, and when to try again
    (`retry_after_s`, whole seconds; absent when the operator allows none at all)."""
    what = DESCRIBE.get(e.limit, e.limit).format(n=e.value)
    extra: dict[str, object] = {"limit": e.limit, "max": e.value}
    if e.retry_after_s is None:
        return ControlPlaneError(ErrorCode.LIMIT_EXCEEDED, f"limit reached: {what} for this caller",
                                 hint="the operator allows this caller none; ask them", **extra)
    extra["retry_after_s"] = max(1, math.ceil(e.retry_after_s))
    return ControlPlaneError(ErrorCode.LIMIT_EXCEEDED, f"limit reached: {what} for this caller",
                             hint=HINTS.get(e.limit), **extra)
