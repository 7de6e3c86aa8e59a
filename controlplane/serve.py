"""Running the MCP server on a transport: stdio, or Streamable HTTP at /mcp.

Over HTTP the same app also serves the runner callback API and signed downloads, so runners and
agents reach one address, and the operator's dashboard and /metrics (`controlplane.dashboard`,
loopback clients only by default). Binding anywhere but loopback requires auth: static bearer tokens, or
OAuth access tokens (`controlplane.mcp.oauth`, with each request's scope checked by
`controlplane.http.scopes`).

HTTP hygiene: every request's Host must be a loopback name, the public URL's host or one of
`CONTROLPLANE_ALLOWED_HOSTS` (else 421), and a browser's Origin must be loopback, the public URL's
origin or one of `CONTROLPLANE_ALLOWED_ORIGINS` (else 403): DNS-rebinding protection. 2025-11-25
streams are resumable with Last-Event-ID (an in-memory replay buffer, `http/replay.py`); 2026-07-28 calls that stream
nothing are answered as plain JSON (`controlplane.http.quiet_json`).
"""

from __future__ import annotations

import gc
from typing import Any
from urllib.parse import urlsplit

from controlplane.app import ControlPlane
from controlplane.dashboard import routes as dashboard
from controlplane.http.body_limit import BodyLimit
from controlplane.http.listener import Listener
from controlplane.http.load import CountCalls
from controlplane.http.loopback import is_loopback
from controlplane.http.quiet_json import QuietJsonRouter
from controlplane.http.replay import ReplayBuffer
from controlplane.http.scopes import ScopeGate
from controlplane.mcp import compat
from controlplane.mcp.auth import load_tokens
from controlplane.mcp.oauth import ResourceServer
from controlplane.mcp.server import build_server
from controlplane.ops import logs, metrics


class UnsafeBind(ValueError):
    pass


def http_app(cp: ControlPlane, listener: Listener, host: str) -> Any:
    """The Starlette app serving MCP at /mcp plus the runner and download routes."""
    if not is_loopback(host) and not load_tokens(cp.settings) and not cp.settings.oauth:
        raise UnsafeBind(f"refusing to listen on {host} without auth: set CONTROLPLANE_AUTH_ISSUER (OAuth), "
                         "CONTROLPLANE_AUTH_TOKENS or CONTROLPLANE_AUTH_TOKENS_FILE, or bind 127.0.0.1")
    cp.set_public_url(cp.settings.public_url or listener.url)
    settings = cp.settings
    public = urlsplit(cp.public_url or listener.url)
    hosts = [public.netloc, public.hostname or "", *settings.allowed_host_list()]
    origins = [f"{public.scheme}://{public.netloc}", *settings.allowed_origin_list()]
    events = ReplayBuffer(max_events=settings.event_store_max_events,
                          events_per_stream=settings.event_store_events_per_stream, ttl_s=settings.event_store_ttl_s)
    mcp = build_server(cp)
    app = mcp.http_app(path="/mcp", host_origin_protection=True, allowed_hosts=[h for h in hosts if h],
                       allowed_origins=origins, event_store=events)
    app.state.quiet_json = route_quiet_calls_as_json(app) if settings.json_responses else None
    compat.wrap_mcp_endpoint(app, "/mcp", lambda inner: CountCalls(inner, cp.service.load))
    if settings.metrics:
        compat.wrap_mcp_endpoint(app, "/mcp", metrics.TimeMcpCalls)
    app.router.routes.extend(dashboard.routes(cp, mcp.auth))  # /dashboard and /metrics (loopback by default)
    auth = mcp.auth
    # OAuth: the scope each request needs, checked before the rest (outermost inside the token check).
    app.state.scope_gate = compat.wrap_mcp_endpoint(
        app, "/mcp", lambda inner: ScopeGate(inner, auth.tokens.scopes, str(auth.metadata_url))
    ) if isinstance(auth, ResourceServer) else None
    compat.wrap_mcp_endpoint(app, "/mcp", BodyLimit)  # outermost: before anything reads the body
    return app


def route_quiet_calls_as_json(app: Any) -> QuietJsonRouter:
    """Put the JSON router where the SDK's app is mounted at /mcp (inside the token check)."""
    return compat.wrap_mcp_endpoint(app, "/mcp", lambda sdk_app: QuietJsonRouter(sdk_app, frozenset({"wait_task"})))


class HttpServer:
    """The MCP HTTP app on a bound socket; `url` is the MCP endpoint."""

    def __init__(self, cp: ControlPlane, host: str = "127.0.0.1", port: int = 0):
        logs.set_replica(cp.holder)  # every log record names the replica that wrote it
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


def settle_heap() -> None:
    """Call once the server is built, before it serves: what start-up made (modules, schemas, the
    app) leaves the garbage collector's view for good (`gc.freeze`). A full collection then walks
    only what the server made since. Without it, the reconciler's rows (10,000 watched jobs live
    through a cycle and reach the oldest generation) set off a walk of the whole start-up heap
    every other cycle (`bench/run.py` shows the cycle's time)."""
    gc.collect()
    gc.freeze()


async def serve_stdio(cp: ControlPlane) -> None:
    logs.set_replica(cp.holder)  # every log record names the replica that wrote it
    mcp = build_server(cp, with_auth=False)
    settle_heap()
    # (fastmcp's log level comes with a console handler of its own: not in the JSON format)
    await mcp.run_stdio_async(show_banner=False, log_level=None if logs.is_json() else "WARNING")
