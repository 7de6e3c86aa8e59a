"""Tool calls from the command line over MCP's stateless Streamable HTTP wire (protocol version
2026-07-28): each call one JSON-RPC `tools/call` POST carrying its version and client in `_meta`
and its routing headers, answered as JSON (or as an SSE stream, read to its response), all of
one command's calls on one kept-alive connection, with nothing but httpx.

Why not an MCP client library: importing one costs a command about a second, more than its calls
take (docs/design/uploads.md, "What it costs"). A server that refuses these requests (one that
speaks only the handshake versions) raises `NotModern`, and the caller uses fastmcp's client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import httpx

from controlplane import __version__

VERSION = "2026-07-28"
CLIENT = {"name": "controlplane-cli", "version": __version__}


class NotModern(Exception):
    """The server did not answer this version's request as one (its status or body says why)."""


class Refused(Exception):
    """The server refused the token (or its absence): HTTP 401 or 403."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class Caller:
    """Calls tools at one server URL with one bearer token (or none)."""

    def __init__(self, url: str, token: str | None):
        self.url = url
        self.headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                        "mcp-protocol-version": VERSION, "mcp-method": "tools/call"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self.http = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0))
        self.ids = iter(range(1, 1 << 62))

    def call(self, tool: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(is_error, the tool's structured answer). Raises `Refused`, `NotModern`, or httpx's
        errors when the server cannot be reached."""
        rid = next(self.ids)
        body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
            "name": tool, "arguments": args, "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientInfo": CLIENT,
                "io.modelcontextprotocol/clientCapabilities": {}}}}
        with self.http.stream("POST", self.url, content=json.dumps(body).encode(),
                              headers={**self.headers, "mcp-name": tool}) as r:
            if r.status_code in (401, 403):
                raise Refused(r.status_code)
            kind = r.headers.get("content-type", "")
            if r.status_code != 200:
                raise NotModern(f"HTTP {r.status_code}")
            try:
                if kind.startswith("application/json"):
                    message = json.loads(r.read())
                elif kind.startswith("text/event-stream"):
                    message = next((m for m in _messages(r.iter_lines()) if m.get("id") == rid), {})
                else:
                    raise NotModern(f"an answer of type {kind!r}")
            except ValueError as e:  # not JSON: not an MCP answer
                raise NotModern(f"an answer that is not JSON ({e})") from None
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):  # a JSON-RPC error (e.g. an unsupported version), or nothing
            raise NotModern(json.dumps(message.get("error") if isinstance(message, dict) else message)[:200])
        data = result.get("structuredContent")
        if data is None:
            data = json.loads(result["content"][0]["text"])
        return bool(result.get("isError")), data


def _messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE stream, one per event's data."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            message = json.loads("\n".join(data))
            data = []
            if isinstance(message, dict):
                yield message


@cache
def caller(url: str, token: str | None) -> Caller:
    """The command's one caller for this server and token (one connection for all its calls)."""
    return Caller(url, token)
