"""Resource subscriptions to tasks: a client that subscribed to `task://{task_id}` hears when the
task changes (state, progress, result), then reads the resource again.

- 2026-07-28: `subscriptions/listen` with `resourceSubscriptions: ["task://...", ...]`. The SDK's
  `ListenHandler` serves each stream (ack first, frames stamped with the subscription id); its
  bus is private to the stream and fed from the progress hub for the caller's own tasks.
- 2025-11-25 and older: `resources/subscribe` / `resources/unsubscribe`, and
  `notifications/resources/updated` on the connection's standalone channel.

A URI that names no task, or another caller's task, is accepted and never fires: the same answer
for both, as everywhere else. Updates are coalesced to at most 4 a second per subscription (the
newest change always arrives). A subscription costs no polling: the hub hears of every commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated, ServerEvent
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from controlplane import blocking
from controlplane.mcp import compat
from controlplane.mcp.progress import MIN_INTERVAL_S
from controlplane.mcp.tools import current_caller

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane

log = logging.getLogger("controlplane.mcp.subscriptions")

TASK_SCHEME = "task://"
MAX_URIS_PER_LISTEN = 256  # task URIs one listen stream may name
MAX_WATCHES_PER_CONNECTION = 256  # resources/subscribe per 2025-era connection
MAX_STREAMS = 1024  # listen streams open at once, server-wide
LIVENESS_CHECK_S = 60.0  # a quiet 2025-era watch checks this often that its connection lives


def task_id_of(uri: str) -> str | None:
    if not uri.startswith(TASK_SCHEME):
        return None
    task_id = uri[len(TASK_SCHEME):]
    return task_id if task_id and "/" not in task_id else None


class TaskSubscriptions:
    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self._handlers: set[ListenHandler] = set()  # one per open listen stream
        self._buses: set[InMemorySubscriptionBus] = set()  # and its bus (list changes go to every one)
        # 2025-era: per client connection (gone with it), uri -> the watch that notifies it
        self._watches: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Task[None]]] = weakref.WeakKeyDictionary()

    def install(self, mcp: FastMCP) -> None:
        low = compat.low_level_server(mcp)  # spec methods are not extension methods: registered on the SDK server
        low.add_request_handler("subscriptions/listen", mcp_types.SubscriptionsListenRequestParams, self.listen)
        low.add_request_handler("resources/subscribe", mcp_types.SubscribeRequestParams, self.subscribe)
        low.add_request_handler("resources/unsubscribe", mcp_types.UnsubscribeRequestParams, self.unsubscribe)

    async def close(self) -> None:
        """Server shutdown: end listen streams gracefully, stop every 2025-era watch."""
        for handler in list(self._handlers):
            handler.close()
        watches = [w for per_conn in list(self._watches.values()) for w in per_conn.values()]
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)

    # ---- the caller's own tasks -----------------------------------------------------------------
    async def _owned(self, uri: str) -> str | None:
        task_id = task_id_of(uri)
        if task_id is None:
            return None
        caller = current_caller(self.cp.settings.default_owner)
        task = await blocking.call(self.cp.service.get, caller, task_id)
        return task_id if task is not None else None

    async def _watch(self, task_id: str, notify: Callable[[], Awaitable[bool]],
                     alive: Callable[[], bool] = lambda: True) -> None:
        """`notify()` after the task changes, at most 4 times a second (changes in between
        coalesce into one), until it answers False or, in a quiet spell, `alive()` does. Reads
        nothing itself: the hub hears of every commit."""
        async with contextlib.aclosing(self.cp.hub.watch(task_id, read=None, quiet_s=LIVENESS_CHECK_S)) as sightings:
            async for seen in sightings:
                if not (alive() if seen.quiet else await notify()):
                    return
                await asyncio.sleep(MIN_INTERVAL_S)

    # ---- 2026-07-28: subscriptions/listen -------------------------------------------------------
    async def listen(self, ctx: ServerRequestContext[Any, Any],
                     params: mcp_types.SubscriptionsListenRequestParams) -> mcp_types.SubscriptionsListenResult:
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if len(uris) > MAX_URIS_PER_LISTEN:
            raise MCPError(code=INVALID_PARAMS, message=f"at most {MAX_URIS_PER_LISTEN} resource URIs per "
                                                        "subscription; open another stream for more")
        if len(self._handlers) >= MAX_STREAMS:
            raise MCPError(code=mcp_types.INTERNAL_ERROR, message="subscription limit reached; try again later")
        bus = InMemorySubscriptionBus()  # this stream's own: it carries only the caller's tasks

        def publisher(uri: str) -> Callable[[], Awaitable[bool]]:
            async def publish() -> bool:
                await bus.publish(ResourceUpdated(uri=uri))
                return True  # the stream's end cancels the watch

            return publish

        watches = []
        for uri in uris:
            task_id = await self._owned(uri)
            if task_id is not None:
                watches.append(asyncio.create_task(self._watch(task_id, publisher(uri))))
        handler = ListenHandler(bus, max_subscriptions=1)
        self._handlers.add(handler)
        self._buses.add(bus)
        try:
            return await handler(ctx, params)
        finally:
            self._handlers.discard(handler)
            self._buses.discard(bus)
            for w in watches:
                w.cancel()

    async def publish(self, *events: ServerEvent) -> None:
        """`events` (a tool or prompt list changed) to every open listen stream that asked for them."""
        for bus in list(self._buses):
            for event in events:
                await bus.publish(event)

    # ---- 2025-11-25 and older: resources/subscribe ----------------------------------------------
    async def subscribe(self, ctx: ServerRequestContext[Any, Any],
                        params: mcp_types.SubscribeRequestParams) -> mcp_types.EmptyResult:
        uri = str(params.uri)
        connection = compat.connection_of(ctx.session)  # the client's connection: where its notifications go
        watches = self._watches.setdefault(connection, {})
        if uri in watches:
            return mcp_types.EmptyResult()  # subscribing twice is subscribing once
        if len(watches) >= MAX_WATCHES_PER_CONNECTION:
            raise MCPError(code=INVALID_PARAMS, message=f"at most {MAX_WATCHES_PER_CONNECTION} resource "
                                                        "subscriptions per connection; unsubscribe some first")
        task_id = await self._owned(uri)
        if task_id is None:
            return mcp_types.EmptyResult()  # accepted; never fires (unknown and foreign alike)
        ref = weakref.ref(connection)  # a watch must not keep a closed connection alive

        async def notify() -> bool:
            conn = ref()
            if conn is None:
                return False
            try:
                await conn.outbound.notify("notifications/resources/updated", {"uri": uri})
            except Exception as e:  # noqa: BLE001 - the connection closed: the subscription ends
                log.debug("stopped notifying %s: %r", uri, e)
                return False
            return True

        # A fresh context: the request's own would hold the session, and so the connection.
        watch = asyncio.create_task(self._watch(task_id, notify, alive=lambda: ref() is not None),
                                    context=contextvars.Context())
        watches[uri] = watch
        watch.add_done_callback(lambda _: watches.pop(uri, None))
        return mcp_types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any],
                          params: mcp_types.UnsubscribeRequestParams) -> mcp_types.EmptyResult:
        watch = self._watches.get(compat.connection_of(ctx.session), {}).get(str(params.uri))
        if watch is not None:
            watch.cancel()
        return mcp_types.EmptyResult()
