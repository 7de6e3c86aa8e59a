"""Running the MCP server on a transport: stdio, or Streamable HTTP at /mcp.

Over HTTP the same app also serves the runner callback API and signed downloads, so runners and
agents reach one address. Binding anywhere but loopback requires bearer-token auth.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from controlplane.app import ControlPlane
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


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


def http_app(cp: ControlPlane, sock: socket.socket, host: str) -> Any:
    """The Starlette app serving MCP at /mcp plus the runner and download routes."""
    if not is_loopback(host) and not load_tokens(cp.settings):
        raise UnsafeBind(f"refusing to listen on {host} without auth: set CONTROLPLANE_AUTH_TOKENS or "
                         "CONTROLPLANE_AUTH_TOKENS_FILE, or bind 127.0.0.1")
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    cp.set_public_url(cp.settings.public_url or f"http://{shown}:{port}")
    mcp = build_server(cp)
    return mcp.http_app(path="/mcp")


class HttpServer:
    """uvicorn serving `http_app` on a bound socket; `url` is the MCP endpoint."""

    def __init__(self, cp: ControlPlane, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.sock = bind(host, port)
        app = http_app(cp, self.sock, host)
        self.url = f"{cp.public_url}/mcp"
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)

    async def serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    def stop(self) -> None:
        self.server.should_exit = True


async def serve_stdio(cp: ControlPlane) -> None:
    mcp = build_server(cp, with_auth=False)
    await mcp.run_stdio_async(show_banner=False, log_level="WARNING")
