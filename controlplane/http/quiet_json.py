"""JSON answers for the calls that stream nothing (2026-07-28 era, Streamable HTTP).

The SDK's modern handler answers a POST either as one JSON body (`json_response=True` for the
whole app) or as a deferred SSE stream that falls back to JSON when the handler sent nothing.
The deferred path costs a task group, a channel and a disconnect watcher on every call. Most
of our calls are point reads that cannot stream (no progressToken, no log level asked for, not
`wait_task`), so this router sends those straight down the JSON path and everything else down
the SSE one. `bench/protocol.py` measures the difference (part 2).

It sits where the SDK's ASGI app sits (inside the bearer-token check), so authentication,
sessions and the 2025-11-25 era are untouched.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.http.body import read_body
from controlplane.mcp import compat

VERSION_HEADER = b"mcp-protocol-version"
STREAMING_META = ("progressToken", "io.modelcontextprotocol/logLevel")
MAX_PEEK = 1024 * 1024  # a body this large goes the usual way, unparsed here


def may_stream(body: Any, streaming_tools: frozenset[str]) -> bool:
    """Whether this request may send anything before its response."""
    if not isinstance(body, dict):
        return True
    params = body.get("params")
    if not isinstance(params, dict):
        return body.get("method") == "subscriptions/listen"
    meta = params.get("_meta")
    if isinstance(meta, dict) and any(k in meta for k in STREAMING_META):
        return True
    method = body.get("method")
    return method == "subscriptions/listen" or (method == "tools/call" and params.get("name") in streaming_tools)


class QuietJsonRouter:
    """Wraps the SDK's ASGI app (fastmcp's `StreamableHTTPASGIApp`)."""

    def __init__(self, inner: Any, streaming_tools: frozenset[str]):
        self.inner: ASGIApp = inner
        self.streaming_tools = streaming_tools
        self.json_answers = 0  # how many calls took the JSON path (the tests look)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = next((v for k, v in scope.get("headers", ()) if k == VERSION_HEADER), None)
        manager = compat.session_manager_of(self.inner)
        if (scope["type"] != "http" or scope["method"] != "POST" or version is None or manager is None
                or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.inner(scope, receive, send)
            return
        body, complete, replay = await read_body(receive)
        if not complete:  # gone before the body arrived
            await self.inner(scope, replay, send)
            return
        try:
            quiet = len(body) <= MAX_PEEK and not may_stream(json.loads(body), self.streaming_tools)
        except (ValueError, RecursionError):
            quiet = False  # the SDK answers malformed bodies itself
        if not quiet:
            await self.inner(scope, replay, send)
            return
        self.json_answers += 1
        # The manager's own arguments, with JSON answers on: the same handler, without the stream.
        await compat.answer_modern_as_json(manager, scope, replay, send)
