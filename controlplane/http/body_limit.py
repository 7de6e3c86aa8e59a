"""The MCP endpoint's request-body limit, answered in a shape the MCP SDKs surface.

The SDK refuses a body over its limit (4 MiB) with a plain-text 413, which its clients report as
an opaque "Server returned an error response". This gate, outermost where the SDK's app is
mounted (`compat.wrap_mcp_endpoint`, before anything that reads the body), refuses the same
bodies with 413 and a JSON-RPC error (id null, which the SDK clients match to the request they
sent): its message and `data` are the refusal of an oversize submit (`errors.too_large`), with
the limit. A body is read up to the limit and handed on whole; beyond it nothing reaches the app
and the rest is read and dropped (so that the client, still sending, gets the answer).
"""

from __future__ import annotations

import json

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.errors import too_large

INVALID_REQUEST = -32600  # JSON-RPC's code for a request that cannot be taken as sent


class BodyLimit:
    def __init__(self, inner: ASGIApp, limit: int = DEFAULT_MAX_REQUEST_BODY_SIZE):
        self.inner = inner
        self.limit = limit
        self.refused = 0  # how many bodies were refused (the tests look)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await _drain(receive)
            await self._refuse(send, int(declared))
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                if message.get("more_body", False):
                    await _drain(receive)
                await self._refuse(send, None)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.inner(scope, replay, send)

    async def _refuse(self, send: Send, size: int | None) -> None:
        self.refused += 1
        err = too_large(f"the request body is {f'{size} bytes' if size else 'larger than the limit'}; "
                        f"the limit is {self.limit} bytes", limit_bytes=self.limit)
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
            "code": INVALID_REQUEST, "message": f"{err.code}: {err.message} ({err.hint})", "data": err.to_dict()}},
            separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> None:
    """Read the rest of the body and drop it: a client still sending when the answer comes and
    the connection closes sees a reset, not the answer."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
