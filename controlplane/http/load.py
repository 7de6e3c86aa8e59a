"""Counting the MCP calls waiting for an answer, for `blocking.Load`.

A submit alone is written on the event loop; one made while other calls wait for the loop joins
a group commit, whose fsync runs off the loop (`TaskService.submit_grouped`). What counts as
waiting: a POST to the MCP endpoint from its arrival until its answer, or the first message of
its stream, is sent (an SSE stream's priming event, which carries no message, does not count:
the 2025-11-25 era opens every stream with one). Calls are interleaved on the loop only between
their awaits, so counting inside the tools would see the others only rarely; here every call
queued behind the loop is seen. A stream that has sent its first message (a `wait_task`'s
progress) no longer counts, nor does a GET stream.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.blocking import Load


class CountCalls:
    """Wraps the MCP endpoint's ASGI app; counts its unanswered POSTs into `load`."""

    def __init__(self, inner: ASGIApp, load: Load):
        self.inner = inner
        self.load = load

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        load = self.load
        load.begin()
        waiting = True

        async def answered(message: Message) -> None:
            nonlocal waiting
            if waiting and message["type"] == "http.response.body" and (
                    b'"jsonrpc"' in message.get("body", b"") or not message.get("more_body", False)):
                waiting = False
                load.answered()
            await send(message)

        try:
            await self.inner(scope, receive, answered)
        finally:
            if waiting:
                load.answered()
