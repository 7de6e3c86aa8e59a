"""MCP on the wire: raw JSON-RPC over Streamable HTTP, for the tests where the wire shape matters
(SSE event ids, Last-Event-ID, standalone streams, headers, the 2025-11-25 `tasks/*` shapes), and
over the pipes of a stdio server (every message the server writes, in order)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
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


class Stdio:
    """`controlplane serve --transport stdio` on pipes, spoken to in raw JSON-RPC, in either era
    (`LEGACY`: initialize first; `MODERN`: the `_meta` envelope on every request). `messages`
    holds every message the server wrote, in order."""

    def __init__(self, env: dict[str, str], cwd: Path, era: str = LEGACY):
        self.env, self.cwd, self.era = env, cwd, era
        self.messages: list[dict[str, Any]] = []
        self.next_id = 0
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stdio:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controlplane.cli", "serve", "--transport", "stdio", env=self.env, cwd=self.cwd,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        self._reader = asyncio.create_task(self._read())
        if self.era == LEGACY:
            init = await self.request("initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                                     "clientInfo": {"name": "raw", "version": "1"}})
            assert init["result"]["protocolVersion"] == LEGACY, init
            self.notify("notifications/initialized")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()  # end of input: the server shuts down
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.messages.append(json.loads(line))

    def _write(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())

    def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request without waiting for its answer; returns its id."""
        self.next_id += 1
        params = dict(params or {})
        if self.era == MODERN:
            params["_meta"] = modern_body(method, {}, meta=params.get("_meta"))["params"]["_meta"]
        self._write({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params or {}})

    def answers(self, request_id: int) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("id") == request_id and "method" not in m]

    async def answer(self, request_id: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (found := self.answers(request_id)):
            assert time.monotonic() < deadline, f"no answer to {request_id}: {self.messages[-5:]}"
            await asyncio.sleep(0.02)
        return found[0]

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.answer(self.send(method, params))

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tools/call's structured content (an error result's too)."""
        return (await self.request("tools/call", {"name": tool, "arguments": arguments}))["result"]["structuredContent"]
