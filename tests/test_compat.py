"""The fastmcp/mcp internals we rely on (`controlplane.mcp.compat`), one test each, observed through
real clients over real HTTP where that is how we use them: when an SDK release changes one, its
test says which and what compat's docstring advises. A small FastMCP server stands in for ours, so
that a failure points at the SDK, not at the control plane.

Last, a scan: no module of controlplane/ or bench/ but compat.py names a private attribute or
module of fastmcp, mcp, mcp_types, starlette or uvicorn (the rule is in `private_sdk_names_in`).
"""

from __future__ import annotations

import ast
import asyncio
import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types
import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.client.messages import MessageHandler
from fastmcp.server.middleware import Middleware
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from controlplane.http.listener import Listener
from controlplane.mcp import compat
from controlplane.mcp.auth import BearerTokens
from tests.wire import modern_headers, modern_request

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

ROOT = Path(__file__).resolve().parent.parent
SDKS = ("fastmcp", "mcp", "mcp_types", "starlette", "uvicorn")


def installed() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in compat.CHECKED_AGAINST}


def changed(what: str) -> str:
    """The message of a failed check: which internal, and where to look."""
    return (f"SDK internal changed: {what}. controlplane/mcp/compat.py was checked against "
            f"{compat.CHECKED_AGAINST}; installed: {installed()}. Its docstring says what each internal is "
            "for and what to do if it goes away.")


# ---- a small FastMCP server, served on 127.0.0.1 ---------------------------------------------------
def probe_server(**kw: Any) -> FastMCP:
    @asynccontextmanager
    async def lifespan(_server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        yield {"marker": "probe-lifespan"}

    mcp = FastMCP(name="compat-probe", lifespan=lifespan, **kw)

    @mcp.tool
    def echo(region: str = "") -> dict[str, str]:
        """Echoes its argument."""
        return {"region": region}

    @mcp.tool
    async def halfway(ctx: Context) -> str:
        """Reports progress once (for a progressToken), then answers."""
        await ctx.report_progress(1, 2)
        return "done"

    return mcp


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """`app` on a loopback port, lifespan on; yields the MCP URL."""
    listener = Listener("127.0.0.1", 0)
    task = asyncio.create_task(listener.serve(app, lifespan="on"))
    try:
        with anyio.fail_after(30):
            while not listener.started:
                assert not task.done(), task
                await asyncio.sleep(0.01)
        yield f"{listener.url}/mcp"
    finally:
        listener.stop()
        await task


async def post_modern(http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None,
                      *, meta: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    body, h = modern_request(method, params, meta=meta, **headers)
    return await http.post(url, json=body, headers=h)


def result_of(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response, JSON or SSE."""
    if r.headers["content-type"].startswith("application/json"):
        return r.json()
    messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]
    [msg] = [m for m in messages if "id" in m]
    return msg


# ---- 1. FastMCP._mcp_server ------------------------------------------------------------------------------
async def test_low_level_server_is_the_server_that_answers() -> None:
    """A request handler added to `low_level_server(mcp)` is what a client reaches, and the SDK
    derives the capability from it (how subscriptions.py serves resources/subscribe)."""
    mcp = probe_server()
    try:
        low = compat.low_level_server(mcp)
    except AttributeError as e:
        pytest.fail(changed(f"FastMCP._mcp_server is gone: {e}"))
    assert isinstance(low, Server), changed(f"FastMCP._mcp_server is a {type(low)!r}, not the SDK's Server")
    heard: list[str] = []

    async def subscribe(ctx: Any, params: mcp_types.SubscribeRequestParams) -> mcp_types.EmptyResult:
        heard.append(str(params.uri))
        return mcp_types.EmptyResult()

    low.add_request_handler("resources/subscribe", mcp_types.SubscribeRequestParams, subscribe)
    async with Client(mcp, mode="legacy") as client:
        caps = client.initialize_result.capabilities
        assert caps.resources is not None and caps.resources.subscribe is True, changed(
            "a resources/subscribe handler on FastMCP._mcp_server no longer advertises resources.subscribe")
        await client.session.subscribe_resource("probe://1")
    assert heard == ["probe://1"], changed("a handler added on FastMCP._mcp_server is not what answers")


# ---- 1a. get_tool_input_schema ---------------------------------------------------------------------------
async def test_the_input_schema_lookup_replaces_the_hidden_tools_list() -> None:
    """Without a lookup, the SDK runs a tools/list before each 2026-07-28 tools/call with
    arguments (to validate Mcp-Param-* headers); with one, it asks the lookup and lists nothing."""
    listings: list[str] = []
    looked_up: list[str] = []

    class CountListings(Middleware):
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            listings.append("tools/list")
            return await call_next(context)

    # A schema that differs from the tool's own: the header check follows it only if it is ours.
    annotated = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}

    def lookup(name: str) -> dict[str, Any] | None:
        looked_up.append(name)
        return annotated if name == "echo" else None

    mcp = probe_server()
    mcp.add_middleware(CountListings())
    async with served(mcp.http_app(path="/mcp")) as url, httpx.AsyncClient(timeout=30) as http:
        call = {"name": "echo", "arguments": {"region": "eu"}}
        r = await post_modern(http, url, "tools/call", call)
        assert r.status_code == 200 and listings == ["tools/list"], (
            "the SDK no longer lists the tools before a tools/call: the lookup may be pointless now "
            f"({r.status_code}, {listings})")

        compat.set_input_schema_lookup(mcp, lookup)
        listings.clear()
        r = await post_modern(http, url, "tools/call", call, **{"Mcp-Param-Region": "eu"})
        assert r.status_code == 200, r.text
        assert result_of(r)["result"]["structuredContent"] == {"region": "eu"}
        assert listings == [] and looked_up == ["echo"], changed(
            f"with get_tool_input_schema set, the SDK still listed tools ({listings}) or did not ask the "
            f"lookup ({looked_up})")
        # the header check used the lookup's schema: the body's region without its header is refused
        r = await post_modern(http, url, "tools/call", call)
        assert r.status_code == 400 and listings == [], changed(
            f"the SDK did not validate Mcp-Param-* headers against the looked-up schema ({r.status_code})")


# ---- 2. ServerSession._connection ----------------------------------------------------------------------
class Updates(MessageHandler):
    def __init__(self) -> None:
        self.uris: list[str] = []

    async def on_resource_updated(self, message: mcp_types.ResourceUpdatedNotification) -> None:
        self.uris.append(str(message.params.uri))


async def test_connection_of_is_the_clients_connection_and_notifies_it() -> None:
    """`connection_of(ctx.session)` is one object per client connection (subscriptions are keyed
    by it), its `outbound.notify` reaches that client after the request is over, and it is
    collected once the client leaves (a watch holds it weakly and ends then)."""
    mcp = probe_server()
    seen: dict[str, list[weakref.ref[Any]]] = {}
    problems: list[str] = []

    async def subscribe(ctx: Any, params: mcp_types.SubscribeRequestParams) -> mcp_types.EmptyResult:
        try:
            conn = compat.connection_of(ctx.session)
        except AttributeError as e:
            problems.append(f"ServerSession._connection is gone: {e}")
            return mcp_types.EmptyResult()
        if not isinstance(conn, Connection):
            problems.append(f"ServerSession._connection is a {type(conn)!r}, not the SDK's Connection")
        seen.setdefault(str(params.uri).split("/")[-1], []).append(weakref.ref(conn))
        return mcp_types.EmptyResult()

    compat.low_level_server(mcp).add_request_handler("resources/subscribe", mcp_types.SubscribeRequestParams,
                                                     subscribe)
    a_heard, b_heard = Updates(), Updates()
    async with served(mcp.http_app(path="/mcp")) as url:
        async with Client(url, mode="legacy", message_handler=a_heard) as a, \
                Client(url, mode="legacy", message_handler=b_heard) as b:
            for uri in ("probe://a", "probe://a", "probe://b"):
                await (a if uri.endswith("a") else b).session.subscribe_resource(uri)
            assert not problems, changed("; ".join(sorted(set(problems))))
            a1, a2, b1 = seen["a"][0](), seen["a"][1](), seen["b"][0]()
            assert a1 is a2, changed("ServerSession._connection differs between two requests of one client")
            assert a1 is not b1, changed("two clients share one ServerSession._connection")
            await a1.outbound.notify("notifications/resources/updated", {"uri": "probe://a"})
            with anyio.fail_after(10):
                while not a_heard.uris:
                    await anyio.sleep(0.02)
            assert a_heard.uris == ["probe://a"] and b_heard.uris == [], changed(
                "Connection.outbound.notify does not reach its own client")
            del a1, a2, b1
        deadline = time.monotonic() + 10
        while seen["a"][0]() is not None and time.monotonic() < deadline:
            gc.collect()
            await anyio.sleep(0.05)
        assert seen["a"][0]() is None, changed(
            "a client's Connection outlives the client: subscriptions.py's watches would never end")


# ---- 3 and 4. quiet JSON: the SDK app inside http_app, handle_modern_request, _lifespan_state ------------
class JsonWhenAsked:
    """Answers 2026-07-28 POSTs carrying `X-Quiet` through `compat.answer_modern_as_json`."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.managers: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        manager = compat.session_manager_of(self.inner)
        self.managers.append(manager)
        if scope["type"] == "http" and (b"x-quiet", b"1") in scope["headers"] and manager is not None:
            await compat.answer_modern_as_json(manager, scope, receive, send)
        else:
            await self.inner(scope, receive, send)


async def test_a_modern_call_answered_as_json_is_the_sdks_own_answer() -> None:
    """`answer_modern_as_json` answers as the SDK's manager does (same result, same lifespan
    state for the handler), as one JSON body where the manager would stream (SSE)."""
    mcp = probe_server()

    async def lifespan_probe(ctx: Any, params: mcp_types.RequestParams) -> dict[str, Any]:
        state = ctx.lifespan_context
        return {"resultType": "complete", "marker": state.get("marker") if isinstance(state, dict) else repr(state)}

    compat.low_level_server(mcp).add_request_handler("x/lifespan", mcp_types.RequestParams, lifespan_probe)
    app = mcp.http_app(path="/mcp")  # json_response off: the SDK streams what the handler sends
    router = compat.wrap_mcp_endpoint(app, "/mcp", JsonWhenAsked)
    assert isinstance(router, JsonWhenAsked)
    assert compat.session_manager_of(router.inner) is None  # not before the app's lifespan
    async with served(app) as url, httpx.AsyncClient(timeout=30) as http:
        # a call that sends progress before its answer: the SDK's own path streams it
        call, meta = {"name": "halfway", "arguments": {}}, {"progressToken": "p"}
        sse = await post_modern(http, url, "tools/call", call, meta=meta)
        assert sse.headers["content-type"].startswith("text/event-stream"), sse.headers
        assert '"notifications/progress"' in sse.text
        manager = router.managers[-1]
        assert isinstance(manager, StreamableHTTPSessionManager), changed(
            f"fastmcp's SDK app has no session_manager once running ({manager!r}): the quiet-JSON router "
            "would pass every call to the SSE path")
        quiet = await post_modern(http, url, "tools/call", call, meta=meta, **{"X-Quiet": "1"})
        assert quiet.headers["content-type"] == "application/json", changed(
            f"handle_modern_request(json_response=True) did not answer as one JSON body: {quiet.headers}")
        assert result_of(quiet)["result"] == result_of(sse)["result"], changed(
            "the JSON answer differs from the SDK's own")
        for quiet_header in ({}, {"X-Quiet": "1"}):
            r = await post_modern(http, url, "x/lifespan", **quiet_header)
            assert result_of(r)["result"]["marker"] == "probe-lifespan", changed(
                f"handlers do not get the server's lifespan state ({quiet_header or 'SSE path'}): {r.text}")
        # the SDK still answers malformed bodies itself on that path
        r = await http.post(url, content=b"{not json", headers=modern_headers(**{"X-Quiet": "1"}))
        assert r.json()["error"]["code"] == mcp_types.PARSE_ERROR


async def test_the_wrapped_endpoint_sits_inside_the_token_check() -> None:
    """`wrap_mcp_endpoint` finds the SDK app at the MCP path, under RequireAuthMiddleware when
    there is auth: unauthenticated requests never reach the wrapper."""
    token = "tok-probe"
    mcp = probe_server(auth=BearerTokens({hashlib.sha256(token.encode()).hexdigest(): "probe"}))
    app = mcp.http_app(path="/mcp")
    router = compat.wrap_mcp_endpoint(app, "/mcp", JsonWhenAsked)
    async with served(app) as url, httpx.AsyncClient(timeout=30) as http:
        r = await post_modern(http, url, "tools/list")
        assert r.status_code == 401 and router.managers == [], changed(
            f"the wrapper is not inside the bearer-token check ({r.status_code}, {len(router.managers)} calls)")
        r = await post_modern(http, url, "tools/list", Authorization=f"Bearer {token}", **{"X-Quiet": "1"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        assert {t["name"] for t in r.json()["result"]["tools"]} == {"echo", "halfway"}
        assert isinstance(router.managers[-1], StreamableHTTPSessionManager), changed(
            "under auth, the wrapped app is not fastmcp's SDK app")
    with pytest.raises(RuntimeError, match="expected one Route at '/elsewhere'"):
        compat.wrap_mcp_endpoint(probe_server().http_app(path="/mcp"), "/elsewhere", JsonWhenAsked)


# ---- no private SDK names outside compat.py ----------------------------------------------------------
def sdk_private_names() -> set[str]:
    """Private names (one leading underscore) that the SDK packages define or use as attributes,
    and their private module names."""
    names: set[str] = set()
    pattern = re.compile(r"(?:\.|\bdef |\bclass |^[ \t]*)(_[A-Za-z][A-Za-z0-9_]*)\b", re.M)
    for pkg in SDKS:
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.origin is not None, pkg
        for path in Path(spec.origin).parent.rglob("*"):
            if path.name.startswith("_") and not path.name.startswith("__"):
                names.add(path.name.removesuffix(".py"))
            if path.suffix == ".py":
                names.update(n for n in pattern.findall(path.read_text(errors="replace")) if not n.startswith("__"))
    return names


def own_private_names() -> set[str]:
    """Private names our own code defines: attributes of self/cls, functions, classes, module
    globals and modules, in controlplane/, providers/ and bench/."""
    names: set[str] = set()
    for top in ("controlplane", "providers", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if path.stem.startswith("_") and not path.stem.startswith("__"):
                names.add(path.stem)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id in ("self", "cls") and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_sdk_names_in(path: Path, sdk: set[str], own: set[str]) -> list[str]:
    """The rule. A module may not
    - import a module of fastmcp, mcp, mcp_types, starlette or uvicorn whose path has a private
      part (`mcp.server._streamable_http_modern`), nor a private name from one of their modules;
    - name `obj._x` (read, write or delete), or `getattr/setattr/hasattr/delattr(obj, "_x")`, where
      `_x` is private to those packages: they define or use it, and our own code (controlplane,
      providers, bench) never defines it. `self._x` and `cls._x` are always ours.
    A name both we and an SDK define (`_lock`) is not flagged: without types the scan cannot
    tell whose object it is on."""
    found = []
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] in SDKS:
                private = [p for p in parts if p.startswith("_")] + [
                    a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    found.append(f"{rel}:{node.lineno}: from {node.module} import ... ({', '.join(private)})")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in SDKS and any(p.startswith("_") for p in parts):
                    found.append(f"{rel}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in sdk and node.attr not in own:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
            if name in sdk and name not in own:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_catches_what_it_should_and_nothing_of_ours(tmp_path: Path) -> None:
    sdk, own = sdk_private_names(), own_private_names()
    assert {"_mcp_server", "_connection", "_lifespan_state", "_streamable_http_modern"} <= sdk
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from mcp.server._streamable_http_modern import handle_modern_request\n"
        "import mcp.server._streamable_http_modern\n"
        "from fastmcp.client.extension_hooks import _internal_client_extension_factories\n"
        "low = mcp._mcp_server\n"
        "low.get_tool_input_schema = None\n"
        "conn = getattr(ctx.session, '_connection')\n"
        "state = manager._lifespan_state\n"
        "self._mcp_server = 1\n"  # ours: a self attribute
        "self.hub._unsubscribe(x)\n"  # ours: we define _unsubscribe
        "creds = client._not_an_sdk_name\n"  # nobody's we know of: not the scan's business
    )
    found = private_sdk_names_in(bad, sdk, own)
    assert [f.split(": ", 1)[1] for f in found] == [
        "from mcp.server._streamable_http_modern import ... (_streamable_http_modern)",
        "import mcp.server._streamable_http_modern",
        "from fastmcp.client.extension_hooks import ... (_internal_client_extension_factories)",
        "mcp._mcp_server",
        "getattr(ctx.session, '_connection')",
        "manager._lifespan_state",
    ], found


def test_no_module_but_compat_names_a_private_sdk_name() -> None:
    sdk, own = sdk_private_names(), own_private_names()
    compat_module = ROOT / "controlplane" / "mcp" / "compat.py"
    found = [f for top in ("controlplane", "bench") for path in sorted((ROOT / top).rglob("*.py"))
             if path != compat_module for f in private_sdk_names_in(path, sdk, own)]
    assert not found, ("private names of fastmcp/mcp/starlette/uvicorn outside controlplane/mcp/compat.py; "
                       "add a named function to compat.py (and a test here) instead:\n  " + "\n  ".join(found))
    assert private_sdk_names_in(compat_module, sdk, own), "the scan no longer sees compat.py's own internals"


def test_a_cancelled_request_can_still_be_answered() -> None:
    """Internal 5: what `CancelledWaitAnswer` reaches for. Its behaviour (exactly one CANCELLED
    answer to a cancelled wait_task, on stdio in both eras and on 2025-11-25 HTTP) is pinned by
    tests/test_cancel_timeout.py; this names the SDK pieces so a version bump points here."""
    import inspect

    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

    assert callable(getattr(JSONRPCDispatcher, "_write_result", None)), (
        f"mcp {installed().get('mcp')}: JSONRPCDispatcher._write_result is gone (checked against "
        f"{compat.CHECKED_AGAINST['mcp']}); see controlplane/mcp/compat.py internal 5")
    params = list(inspect.signature(JSONRPCDispatcher._write_result).parameters)
    assert params[:3] == ["self", "request_id", "result"], params


# ---- 6. one provider asked directly ---------------------------------------------------------------
async def test_the_direct_lookup_finds_what_fastmcps_own_finds_without_a_task_per_lookup() -> None:
    from fastmcp.server.providers.aggregate import AggregateProvider

    def build(cls: type[FastMCP]) -> FastMCP:
        mcp = cls(name="lookup-probe")

        @mcp.tool
        def echo(region: str = "") -> dict[str, str]:
            """Echoes its argument."""
            return {"region": region}

        @mcp.resource("probe://{name}")
        def thing(name: str) -> str:
            return name

        @mcp.resource("probe://fixed")
        def fixed() -> str:
            return "fixed"

        return mcp

    ours, stock = build(compat.ControlPlaneMCP), build(FastMCP)
    assert len(ours.providers) == 1
    loop = asyncio.get_running_loop()
    created: list[int] = []
    default_factory = loop.get_task_factory()

    def counting(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        created.append(1)
        return default_factory(lp, coro, **kw) if default_factory else asyncio.Task(coro, loop=lp, **kw)

    async def tasks_made(aw: Any) -> tuple[Any, int]:
        created.clear()
        loop.set_task_factory(counting)
        try:
            return await aw, len(created)
        finally:
            loop.set_task_factory(default_factory)

    try:
        for name in ("echo", "nothing-by-that-name"):
            mine, mine_tasks = await tasks_made(ours.get_tool(name))
            theirs, their_tasks = await tasks_made(stock.get_tool(name))
            same_instance_stock = await AggregateProvider._get_tool(ours, name)
            assert (mine is None) == (theirs is None) == (same_instance_stock is None), changed(
                f"a tool lookup ({name}) answers differently from fastmcp's AggregateProvider._get_tool")
            if mine is not None:
                assert mine is same_instance_stock and mine.name == theirs.name == name
            assert their_tasks >= 1, changed("fastmcp no longer looks tools up in a task group: drop the override")
            assert mine_tasks == 0, changed("ControlPlaneMCP._get_tool is no longer what FastMCP.get_tool calls")
        for uri in ("probe://fixed", "probe://nope"):
            mine, mine_tasks = await tasks_made(ours._get_resource(uri))
            theirs = await AggregateProvider._get_resource(ours, uri)
            assert mine is theirs and mine_tasks == 0, changed(f"a resource lookup ({uri}) differs from fastmcp's")
            assert (mine is None) == uri.endswith("nope")
        assert str((await ours.get_resource("probe://fixed")).uri) == "probe://fixed"
        # With a second provider (a mounted server), the lookup is fastmcp's own again.
        child = FastMCP(name="child")

        @child.tool
        def nested() -> str:
            return "nested"

        ours.mount(child)
        assert len(ours.providers) == 2
        found, n_tasks = await tasks_made(ours.get_tool("nested"))
        assert found is not None and found.name == "nested" and n_tasks >= 2
    finally:
        loop.set_task_factory(default_factory)
