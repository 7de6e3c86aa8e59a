"""Running the MCP server on a transport: stdio, or Streamable HTTP at /mcp.

Over HTTP the same app also serves the runner callback API and signed downloads, so runners and
agents reach one address. Binding anywhere but loopback requires bearer-token auth.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from controlplane.app import ControlPlane
from controlplane.http.listener import Listener
from controlplane.mcp.auth import load_tokens
from controlplane.mcp.server import build_server

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class UnsafeBind(ValueError):
    pass


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_app(cp: ControlPlane, listener: Listener, host: str) -> Any:
    """The Starlette app serving MCP at /mcp plus the runner and download routes."""
    if not is_loopback(host) and not load_tokens(cp.settings):
        raise UnsafeBind(f"refusing to listen on {host} without auth: set CONTROLPLANE_AUTH_TOKENS or "
                         "CONTROLPLANE_AUTH_TOKENS_FILE, or bind 127.0.0.1")
    cp.set_public_url(cp.settings.public_url or listener.url)
    return build_server(cp).http_app(path="/mcp")


class HttpServer:
    """The MCP HTTP app on a bound socket; `url` is the MCP endpoint."""

    def __init__(self, cp: ControlPlane, host: str = "127.0.0.1", port: int = 0):
        self.listener = Listener(host, port)
        try:
            self.app = http_app(cp, self.listener, host)
        except Exception:
            self.listener.sock.close()
            raise
        self.url = f"{cp.public_url}/mcp"

    async def serve(self) -> None:
        await self.listener.serve(self.app, lifespan="on")

    @property
    def started(self) -> bool:
        return self.listener.started

    def stop(self) -> None:
        self.listener.stop()


async def serve_stdio(cp: ControlPlane) -> None:
    mcp = build_server(cp, with_auth=False)
    await mcp.run_stdio_async(show_banner=False, log_level="WARNING")
