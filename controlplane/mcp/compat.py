"""Every place where we reach past the public API of fastmcp and the `mcp` SDK, in one module.

The rest of the code (controlplane/, bench/) calls the functions below and never names a private
attribute or module of fastmcp, mcp, mcp_types, starlette or uvicorn: `tests/test_compat.py` scans
for that, and has one test per internal that fails with a clear message when an SDK release
changes it under us. A new internal goes here, with its entry below and its test there.

Checked against (`CHECKED_AGAINST`): fastmcp 4.1.2, mcp 2.3.0, mcp-types 2.3.0, starlette 1.10.0,
uvicorn 0.54.0.

The internals
-------------

1. `FastMCP._mcp_server` (fastmcp): the SDK low-level server (`mcp.server.lowlevel.Server`, as
   fastmcp's `LowLevelServer` subclass) that FastMCP builds in `__init__` and serves on every
   transport. fastmcp has no public accessor. `low_level_server()` returns it, for:

   a. `set_input_schema_lookup()`: setting the SDK server's `get_tool_input_schema` (a public
      attribute of the SDK server, documented there). Before every 2026-07-28 `tools/call` with
      arguments, the SDK checks the request's `Mcp-Param-*` headers against the tool's input
      schema; without a lookup it runs a whole `tools/list` through the server to find it (half
      the cost of a `get_task_status` call). fastmcp's constructor takes no such argument; the
      SDK's own high-level `MCPServer` sets it natively.
      If it goes away: drop the lookup. Calls stay correct; each 2026-07-28 tools/call with
      arguments pays a tools/list again (`bench/protocol.py` shows the cost, and
      `tests/test_http_hygiene.py::test_a_tool_call_does_not_list_every_tool_first` fails).
   b. `add_request_handler()` (public on the SDK server) for `subscriptions/listen`,
      `resources/subscribe` and `resources/unsubscribe` (`controlplane.mcp.subscriptions`): spec
      methods that fastmcp does not serve itself. The SDK derives the `resources.subscribe`
      capability from their presence.
      Public alternative: a fastmcp `ServerExtension` whose `methods()` binds these three names
      (fastmcp registers extension methods on the same low-level server); it would advertise a
      made-up extension id in the capabilities, so it is not used.

2. `ServerSession._connection` (mcp): the per-client `mcp.server.connection.Connection` behind
   the per-request session proxy that handlers get as `ctx.session`. `connection_of()` returns it.
   `controlplane.mcp.subscriptions` keys 2025-era subscriptions by it (one set of watches per
   client connection, held weakly: a watch ends once the connection is collected) and notifies
   on its standalone channel (`Connection.outbound.notify`, public) from a watch that outlives the
   request. There is no public accessor: `ServerRequestContext` carries only the session, and
   `mcp.server.context.Context.connection` is public but the 2.3 runner does not build that
   context. fastmcp itself reads `session._connection` (its context and logging/setLevel code).
   If it goes away: use `Context.connection` if the runner hands it out by then; else keep
   watches per `Mcp-Session-Id` and send with `session.send_resource_updated(uri)` (standalone
   channel), ending them on the transport's session end.

3. `mcp.server._streamable_http_modern.handle_modern_request` (a private module of mcp) and
   `StreamableHTTPSessionManager._lifespan_state` (a private attribute), with the manager's public
   `app` and `security_settings`: `answer_modern_as_json()` answers one 2026-07-28 POST exactly as
   the manager's own `_handle_request` would, with `json_response=True` for that one call
   (`controlplane.http.quiet_json`: calls that cannot stream skip the SSE machinery).
   Public alternatives: `http_app(json_response=True)` for the whole app (every call loses
   streaming: wait_task progress, subscriptions/listen), or a second session manager with
   `json_response=True` beside the first (it would run the server's lifespan twice).
   If it goes away: set `CONTROLPLANE_JSON_RESPONSES=false` (the router is then not installed;
   every call takes the SDK's SSE path, correct but slower: `bench/protocol.py` part 2).

4. The shape of fastmcp's `http_app()` (fastmcp, starlette): the Starlette `Route` at the MCP
   path whose `app` is the SDK app (fastmcp's `StreamableHTTPASGIApp`, whose public
   `session_manager` the app's lifespan sets), bare or wrapped in `RequireAuthMiddleware` (`app`
   attribute). `wrap_mcp_endpoint()` replaces that inner app (monkeypatching the SDK's objects)
   so that the quiet-JSON router sits inside the bearer-token check; `session_manager_of()`
   reads the manager off the SDK app.
   Public alternative: `http_app(middleware=[...])`, but that sits outside the token check.
   If it goes away: `wrap_mcp_endpoint()` raises at startup with what it found; turn the
   router off (`CONTROLPLANE_JSON_RESPONSES=false`) until it is adapted.

5. Answering a cancelled request (`CancelledWaitAnswer`: a cancelled
   wait_task gets exactly one answer, CANCELLED): `ServerSession._request_outbound`, the dispatch
   context's `_inner` (a 2026-07-28 stdio connection wraps it) and `_dispatcher`, and
   `JSONRPCDispatcher._write_result`. mcp drops whatever a cancelled handler returns.
   Public alternative: none (MCP only says a server SHOULD NOT answer a cancelled request).
   If it goes away: `for_request()` returns None and the SDK's behaviour stands (no answer on
   stdio, -32800 on 2025-11-25 HTTP); `tests/test_cancel_timeout.py` fails on each wire.

6. `AggregateProvider._get_tool` and `_get_resource`, with `_get_highest_version_result` and
   `providers` (fastmcp), overridden by `ControlPlaneMCP`, the FastMCP our server is. fastmcp
   finds the component of every `tools/call` (and `resources/read`) by asking each of its
   providers at once, in an anyio task group with a task per provider (`gather`): several times
   the cost of asking our one provider directly, and a task to schedule on every call
   (docs/design/hot-path.md has the figures). With one provider there is nothing to run concurrently: the
   override asks it directly and hands its answer (or its error) to fastmcp's own
   `_get_highest_version_result`, so versions, NotFoundError and `provider_error_strategy` are
   fastmcp's. With more providers (a mounted server) it leaves the lookup to fastmcp.
   If it goes away: drop the override (`ControlPlaneMCP` = FastMCP); lookups are fastmcp's again,
   correct and slower. `tests/test_compat.py` compares it with fastmcp's own lookup.

Not here, because they are public names (if undocumented): uvicorn `Server.started` and
`Server.should_exit` (`controlplane.http.listener`, `bench/servers.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_context
from fastmcp.tools.base import ToolResult
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import ServerMessageMetadata
from mcp_types import SERVER_INFO_META_KEY
from mcp_types import methods as mcp_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.routing import Route

if TYPE_CHECKING:
    from mcp.server.connection import Connection
    from mcp.server.lowlevel.server import Server
    from mcp.server.session import ServerSession
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.types import ASGIApp, Receive, Scope, Send

CHECKED_AGAINST = {"fastmcp": "4.1.2", "mcp": "2.3.0", "mcp-types": "2.3.0", "starlette": "1.10.0",
                   "uvicorn": "0.54.0"}

W = TypeVar("W")
log = logging.getLogger("controlplane.mcp.compat")


# ---- 1. the SDK low-level server under FastMCP ----------------------------------------------------
def low_level_server(mcp: FastMCP) -> Server[Any]:
    """The SDK `Server` that FastMCP serves (`FastMCP._mcp_server`)."""
    return mcp._mcp_server


def set_input_schema_lookup(mcp: FastMCP, lookup: Callable[[str], Mapping[str, Any] | None]) -> None:
    """Let the SDK find a tool's input schema by name (for `Mcp-Param-*` header validation)
    instead of running a `tools/list` through the server before each 2026-07-28 `tools/call`.
    `lookup` is called before any middleware, for every caller alike."""
    low_level_server(mcp).get_tool_input_schema = lookup


# ---- 2. the client connection behind a request's session -------------------------------------------
def connection_of(session: ServerSession) -> Connection:
    """The client connection of a request's session (`ServerSession._connection`): the same
    object for every request of one client connection, gone with it; `.outbound.notify(method,
    params)` sends on its standalone channel."""
    return session._connection


# ---- 3. one 2026-07-28 POST answered as JSON -------------------------------------------------------
async def answer_modern_as_json(manager: StreamableHTTPSessionManager, scope: Scope, receive: Receive,
                                send: Send) -> None:
    """Answer a 2026-07-28 POST as `manager` would, but as one JSON body (no SSE stream)."""
    await handle_modern_request(manager.app, manager.security_settings, True, manager._lifespan_state,
                                scope, receive, send)


# ---- 4. the SDK app inside fastmcp's http_app ----------------------------------------------------------
def session_manager_of(endpoint: Any) -> StreamableHTTPSessionManager | None:
    """The session manager of the SDK app at the MCP path (None before the app's lifespan ran,
    or if `endpoint` is not that app)."""
    return getattr(endpoint, "session_manager", None)


def wrap_mcp_endpoint(app: Any, path: str, wrap: Callable[[ASGIApp], W]) -> W:
    """Put `wrap(sdk_app)` where fastmcp's `http_app()` mounted the SDK app at `path`: inside the
    bearer-token check when there is one. Returns the wrapper."""
    routes = [r for r in getattr(app, "routes", ()) if isinstance(r, Route) and r.path == path]
    if len(routes) != 1:
        raise RuntimeError(f"expected one Route at {path!r} in fastmcp's http_app(), found {len(routes)} "
                           f"(controlplane.mcp.compat, checked against {CHECKED_AGAINST})")
    route = routes[0]
    holder: Any = route.app if isinstance(route.app, RequireAuthMiddleware) else route
    wrapper = wrap(holder.app)
    holder.app = wrapper
    return wrapper


# ---- answering a cancelled wait_task (docs/design/errors-and-cancellation.md) ----------------------
class CancelledWaitAnswer:
    """The one answer to a wait its client cancelled: CANCELLED (docs/design/errors-and-cancellation.md).

    mcp 2.3 answers nothing for a request its client cancelled with `notifications/cancelled`:
    the dispatcher cancels the handler's scope (mcp/shared/jsonrpc_dispatcher.py:640-645) and
    drops whatever the handler returns or raises once `cancel_requested` is set (:749, :763,
    :781). On stdio the client then hears nothing at all; on the 2025-11-25 HTTP wire the
    transport ends the request's stream with a bare JSON-RPC error -32800 "Request cancelled"
    (mcp/server/streamable_http.py:446-458), not our {code: "CANCELLED"} result. MCP only says a
    server SHOULD NOT answer a cancelled request and that a client SHOULD ignore a late answer;
    the answer must be exactly one CANCELLED result. So the wait writes that
    answer itself, on the dispatcher's write stream (the one its progress notifications took, so
    the answer comes after them), shaped as the server shapes every tools/call result for the
    request's era, and clears the transport's `on_request_unanswered` hook so that no -32800
    follows it. The SDK has no public way to answer a request outside its handler's return:
    this reads `ServerSession._request_outbound`, the dispatch context's `_dispatcher` (and
    `_inner` for a 2026-07-28 connection on stdio) and calls `JSONRPCDispatcher._write_result`.
    Where those are not found it does nothing and the SDK's behaviour stands (the tests notice).

    The 2026-07-28 HTTP wire has no answer to give: a POSTed `notifications/cancelled` is
    acknowledged and dropped before any handler sees it (mcp/server/_streamable_http_modern.py:
    223-254, by design: one caller must not cancel another's request by guessing its id), and
    the cancellation the protocol defines there is closing the response stream, after which
    nothing can reach the client (:488-495). There the wait simply ends, and the task goes on.
    """

    def __init__(self, dctx: Any, dispatcher: JSONRPCDispatcher[Any], version: str, server: Any):
        self._dctx = dctx
        self._dispatcher = dispatcher
        self._version = version
        self._server = server  # the low-level server, whose identity 2026-07-28 results carry

    @classmethod
    def for_request(cls) -> CancelledWaitAnswer | None:
        """The current request's, or None where the wire cannot carry one (see the class) or the
        SDK's insides are not what this expects (then the SDK's own behaviour stands)."""
        try:
            ctx = get_context()
            rc = ctx.request_context
            outbound = getattr(rc.session, "_request_outbound", None) if rc is not None else None
            dctx = getattr(outbound, "_inner", outbound)  # a 2026-07-28 stdio connection wraps it
            dispatcher = getattr(dctx, "_dispatcher", None)
            if (rc is None or not isinstance(dispatcher, JSONRPCDispatcher)
                    or not hasattr(dispatcher, "_write_result")
                    or not isinstance(getattr(dctx, "cancel_requested", None), anyio.Event)):
                return None
            return cls(dctx, dispatcher, rc.protocol_version, low_level_server(ctx.fastmcp))
        except (AttributeError, RuntimeError) as e:
            log.warning("a cancelled wait cannot be answered here: %r", e)
            return None

    @property
    def requested(self) -> bool:
        """Whether the client cancelled this request (rather than the server shutting down)."""
        requested: bool = self._dctx.cancel_requested.is_set()
        return requested

    async def send(self, result: ToolResult) -> None:
        """Write `result` as the request's answer; call it shielded, from the cancelled handler."""
        mcp_result = result.to_mcp_result()
        assert isinstance(mcp_result, BaseModel)  # an error result is always a CallToolResult
        dumped = mcp_methods.serialize_server_result(
            "tools/call", self._version, mcp_result.model_dump(by_alias=True, mode="json", exclude_none=True))
        if self._version in MODERN_PROTOCOL_VERSIONS:  # as the server stamps every 2026-07-28 result
            dumped["_meta"] = {**(dumped.get("_meta") or {}), SERVER_INFO_META_KEY: self._server.server_info_stamp}
        metadata = self._dctx.message_metadata
        if isinstance(metadata, ServerMessageMetadata):
            metadata.on_request_unanswered = None  # answered: the transport must not add a -32800
        await self._dispatcher._write_result(self._dctx.request_id, dumped)


# ---- 6. one provider asked directly ---------------------------------------------------------------
class ControlPlaneMCP(FastMCP):
    """FastMCP whose tool and resource lookups ask its one provider directly, not through a task
    group (internal 6 above)."""

    async def _get_tool(self, name: str, version: Any = None) -> Any:
        if len(self.providers) != 1:
            return await super()._get_tool(name, version)
        return await self._ask_the_provider(self.providers[0].get_tool(name, version), f"get_tool({name!r})")

    async def _get_resource(self, uri: str, version: Any = None) -> Any:
        if len(self.providers) != 1:
            return await super()._get_resource(uri, version)
        return await self._ask_the_provider(self.providers[0].get_resource(uri, version), f"get_resource({uri!r})")

    async def _ask_the_provider(self, lookup: Awaitable[Any], operation: str) -> Any:
        """The lookup's answer, or its error judged as fastmcp judges a provider's error."""
        try:
            found: Any = await lookup
        except Exception as e:  # noqa: BLE001 - fastmcp's _get_highest_version_result decides
            found = e
        return self._get_highest_version_result([found], operation)
