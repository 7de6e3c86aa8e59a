"""MCP on the wire: raw JSON-RPC over Streamable HTTP, for the tests where the wire shape matters
(SSE event ids, Last-Event-ID, standalone streams, headers, the 2025-11-25 `tasks/*` shapes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from mcp.shared.inbound import NAME_BEARING_METHODS

LEGACY = "2025-11-25"
MODERN = "2026-07-28"


@dataclass
class Event:
    id: str | None
    data: dict[str, Any] | None  # None: a priming or keep-alive event without a message


async def sse_events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of an SSE response, as they arrive."""
    event_id, data = None, []
    async for line in response.aiter_lines():
        if line == "":
            if event_id is not None or data:
                text = "\n".join(data).strip()
                yield Event(event_id, json.loads(text) if text else None)
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:])


class Legacy:
    """A 2025-11-25 session (initialize, then the session id on every request)."""

    def __init__(self, http: httpx.AsyncClient, url: str, token: str | None = None):
        self.http, self.url, self.session_id, self.next_id = http, url, None, 0
        self.token = token

    def headers(self, **extra: str) -> dict[str, str]:
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
             "MCP-Protocol-Version": LEGACY, **extra}
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def body(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        return {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.body(method, params)
        r = await self.http.post(self.url, json=body, headers=self.headers(), timeout=60)
        assert r.status_code == 200, r.text
        self.session_id = r.headers.get("mcp-session-id", self.session_id)
        if r.headers["content-type"].startswith("application/json"):
            return r.json()
        for line in r.text.splitlines():  # SSE: the response is the data line with our id
            if line.startswith("data:") and line[5:].strip():  # (an event store primes with empty data)
                msg = json.loads(line[5:])
                if msg.get("id") == body["id"]:
                    return msg
        raise AssertionError(r.text)

    async def start(self) -> dict[str, Any]:
        init = await self.request("initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                                 "clientInfo": {"name": "raw", "version": "1"}})
        assert init["result"]["protocolVersion"] == LEGACY, init
        r = await self.http.post(self.url, headers=self.headers(),
                                 json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202
        return init["result"]


def modern_headers(**extra: str) -> dict[str, str]:
    return {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN, **extra}


def modern_request(method: str, params: dict[str, Any] | None = None, *, request_id: int = 1,
                   meta: dict[str, Any] | None = None, **headers: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Body and headers of a 2026-07-28 request: the routing headers repeat the method (and the
    tool or resource it names), as the protocol requires."""
    body = modern_body(method, params, request_id=request_id, meta=meta)
    h = modern_headers(**{"Mcp-Method": method, **headers})
    name_key = NAME_BEARING_METHODS.get(method)
    if name_key and name_key in body["params"]:
        h["Mcp-Name"] = str(body["params"][name_key])
    return body, h


def modern_body(method: str, params: dict[str, Any] | None = None, *, request_id: int = 1,
                meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A 2026-07-28 request: no session; who the client is travels in `_meta` on every request."""
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                       "io.modelcontextprotocol/clientCapabilities": {}, **(meta or {})}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
