"""The scope each MCP request needs, checked before anything runs (OAuth only).

MCP's authorization specification (both eras) answers a token that lacks the scope an operation
needs with HTTP 403 and `WWW-Authenticate: Bearer error="insufficient_scope", scope="..."`,
naming the scope to ask for (SEP-2350: the client adds it to what it holds). That has to happen
at the HTTP layer, before the SDK opens a stream, so this gate sits where the SDK's app is
mounted, inside the bearer-token check (`compat.wrap_mcp_endpoint`).

Which operation a request is: in the 2026-07-28 era the `Mcp-Method` and `Mcp-Name` headers,
which the SDK refuses (-32020) unless they equal the body's method and tool name, so the gate
reads no body; in the 2025-11-25 era the JSON-RPC body (every message of it). The scope table is
`controlplane.mcp.oauth.Scopes.needed`. A refused request reaches nothing: no task is created,
no idempotency key is used, no stream is opened.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.shared.inbound import decode_header_value
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.http.body import read_body
from controlplane.mcp.oauth import Scopes

VERSION_HEADER = b"mcp-protocol-version"
METHOD_HEADER = b"mcp-method"
NAME_HEADER = b"mcp-name"


class ScopeGate:
    def __init__(self, inner: ASGIApp, scopes: Scopes, metadata_url: str):
        self.inner = inner
        self.scopes = scopes
        self.metadata_url = metadata_url
        self.refused = 0  # how many requests were answered 403 (the tests look)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.inner(scope, receive, send)  # GET streams and DELETE carry no operation
            return
        user = scope.get("user")
        held = user.scopes if isinstance(user, AuthenticatedUser) else []
        headers = dict(scope.get("headers", ()))
        version = headers.get(VERSION_HEADER)
        if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
            method = headers.get(METHOD_HEADER, b"").decode("latin-1")
            name = decode_header_value(headers[NAME_HEADER].decode("latin-1")) if NAME_HEADER in headers else None
            missing = self._missing([(method, name)], held)
        else:
            body, _complete, receive = await read_body(receive)
            missing = self._missing(_operations(body), held)
        if missing:
            self.refused += 1
            await self._refuse(send, missing)
            return
        await self.inner(scope, receive, send)

    def _missing(self, operations: list[tuple[str, str | None]], held: list[str]) -> list[str]:
        needed = {self.scopes.needed(m, n) for m, n in operations}
        return sorted(s for s in needed if s is not None and not self.scopes.granted(s, held))

    async def _refuse(self, send: Send, missing: list[str]) -> None:
        wanted = " ".join(self.scopes.requested(missing))
        description = f"this request needs the scope {wanted}"
        challenge = (f'Bearer error="insufficient_scope", error_description="{description}", scope="{wanted}", '
                     f'resource_metadata="{self.metadata_url}"')
        body = json.dumps({"error": "insufficient_scope", "error_description": description}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", challenge.encode())]})
        await send({"type": "http.response.body", "body": body})


def _operations(body: bytes) -> list[tuple[str, str | None]]:
    """(method, tool name) of every request in a JSON-RPC body (responses and unparsable bodies
    name none: the SDK answers those itself, and runs nothing)."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError):
        return []
    out = []
    for msg in parsed if isinstance(parsed, list) else [parsed]:
        method = msg.get("method") if isinstance(msg, dict) else None
        if not isinstance(method, str):
            continue
        params = msg.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        out.append((method, name if isinstance(name, str) else None))
    return out
