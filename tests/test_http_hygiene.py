"""Protocol hygiene over HTTP: DNS-rebinding protection (Host and Origin allow-lists), ping and
logging/setLevel where the era has them, and JSON answers for calls that stream nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import mcp_types
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.conftest import FAST, serving
from tests.wire import Legacy, modern_headers, modern_request

pytestmark = pytest.mark.anyio


def port_of(url: str) -> int:
    return httpx.URL(url).port or 80


async def post_modern(http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None,
                      *, meta: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    body, h = modern_request(method, params, meta=meta, **headers)
    return await http.post(url, json=body, headers=h)


# ---- Host and Origin ---------------------------------------------------------------------------
async def test_a_foreign_host_is_refused_in_both_eras(http_server: Any) -> None:
    url = http_server.url
    async with httpx.AsyncClient() as http:
        evil = {"Host": "evil.example"}
        r = await post_modern(http, url, "tools/list", **evil)
        assert r.status_code == 421
        r = await http.post(url, headers={**Legacy(http, url).headers(), **evil}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}})
        assert r.status_code == 421
        # the download and health routes on the same app too
        assert (await http.get(url.replace("/mcp", "/healthz"), headers=evil)).status_code == 421
        # loopback names, with the port, are fine
        for host in (f"127.0.0.1:{port_of(url)}", f"localhost:{port_of(url)}"):
            r = await post_modern(http, url, "tools/list", Host=host)
            assert r.status_code == 200 and r.json()["result"]["tools"], r.text


async def test_a_foreign_origin_is_refused(http_server: Any) -> None:
    url = http_server.url
    async with httpx.AsyncClient() as http:
        r = await post_modern(http, url, "tools/list", Origin="https://evil.example")
        assert r.status_code == 403
        r = await post_modern(http, url, "tools/list", Origin=f"http://localhost:{port_of(url)}")
        assert r.status_code == 200


async def test_allow_lists_come_from_the_settings(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, allowed_hosts="mcp.example.org, *.corp.example",
                               allowed_origins="https://agent.example.org", **FAST))
    async with serving(cp) as server, httpx.AsyncClient() as http:
        for host, status in (("mcp.example.org", 200), ("a.corp.example:8443", 200), ("evil.example", 421)):
            r = await post_modern(http, server.url, "tools/list", Host=host)
            assert r.status_code == status, (host, r.status_code)
        for origin, status in (("https://agent.example.org", 200), ("https://other.example.org", 403)):
            r = await post_modern(http, server.url, "tools/list", Origin=origin)
            assert r.status_code == status, (origin, r.status_code)


# ---- ping and logging/setLevel -------------------------------------------------------------------
async def test_ping_and_set_level_in_the_2025_era(http_server: Any) -> None:
    async with httpx.AsyncClient() as http:
        rpc = Legacy(http, http_server.url)
        init = await rpc.start()
        assert "logging" in init["capabilities"]
        assert (await rpc.request("ping"))["result"] == {}
        assert (await rpc.request("logging/setLevel", {"level": "warning"}))["result"] == {}
        bad = await rpc.request("logging/setLevel", {"level": "loud"})
        assert bad["error"]["code"] == mcp_types.INVALID_PARAMS
    async with Client(http_server.url, mode="legacy") as client:
        assert await client.ping() is True
        await client.set_logging_level("debug")


async def test_the_2026_era_has_no_ping(http_server: Any) -> None:
    async with httpx.AsyncClient() as http:
        r = await post_modern(http, http_server.url, "ping")
        assert r.json()["error"]["code"] == mcp_types.METHOD_NOT_FOUND


# ---- JSON for calls that stream nothing ------------------------------------------------------------
async def test_quiet_calls_are_answered_as_json_and_streaming_ones_as_sse(http_server: Any, cp: ControlPlane) -> None:
    router = http_server.app.state.quiet_json
    url = http_server.url
    async with httpx.AsyncClient(timeout=60) as http:
        before = router.json_answers
        r = await post_modern(http, url, "tools/call", {"name": "submit_task", "arguments": {
            "tool_name": "exercise", "inputs": {"progress_steps": 6, "sleep_s": 1}}})
        assert r.headers["content-type"] == "application/json" and router.json_answers == before + 1
        tid = r.json()["result"]["structuredContent"]["task_id"]
        r = await post_modern(http, url, "tools/call", {"name": "get_task_status", "arguments": {"task_id": tid}})
        assert r.json()["result"]["structuredContent"]["task_id"] == tid and router.json_answers == before + 2
        # a call that may stream takes the SSE path, and streams
        r = await post_modern(http, url, "tools/call", {"name": "wait_task", "arguments": {"task_id": tid}},
                              meta={"progressToken": "p"})
        assert r.headers["content-type"].startswith("text/event-stream") and router.json_answers == before + 2
        assert '"notifications/progress"' in r.text and '"done":true' in r.text
        # malformed bodies still get the SDK's own answer
        r = await http.post(url, content=b"{not json", headers=modern_headers())
        assert r.json()["error"]["code"] == mcp_types.PARSE_ERROR


async def test_json_answers_keep_the_token_check(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, auth_tokens="tok-a=alice", **FAST))
    async with serving(cp) as server, httpx.AsyncClient() as http:
        r = await post_modern(http, server.url, "tools/call", {"name": "list_tasks", "arguments": {}})
        assert r.status_code == 401
        r = await post_modern(http, server.url, "tools/call", {"name": "list_tasks", "arguments": {}},
                              Authorization="Bearer tok-a")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json()["result"]["structuredContent"]["tasks"] == []


# ---- no hidden tools/list per call -------------------------------------------------------------------
async def test_a_tool_call_does_not_list_every_tool_first(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK validates Mcp-Param-* headers against the called tool's schema; unless the server
    can look that schema up, it runs a whole tools/list through the server on every 2026-07-28
    tools/call (half the cost of a status call). Ours looks it up."""
    from fastmcp.server.middleware import Middleware

    import controlplane.serve

    listings: list[str] = []

    class CountListings(Middleware):
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            listings.append("tools/list")
            return await call_next(context)

    def counting_server(cp: ControlPlane, **kw: Any) -> Any:
        mcp = build_server(cp, **kw)
        mcp.add_middleware(CountListings())
        return mcp

    monkeypatch.setattr(controlplane.serve, "build_server", counting_server)
    async with serving(cp) as server, httpx.AsyncClient() as http:
        for _ in range(3):
            r = await post_modern(http, server.url, "tools/call", {"name": "list_tasks", "arguments": {"limit": 5}})
            assert r.status_code == 200 and '"isError":false' in r.text.replace(" ", "")
        assert listings == []
        r = await post_modern(http, server.url, "tools/list")
        assert r.status_code == 200 and listings == ["tools/list"]  # the counter does count


async def test_a_header_declared_in_a_catalog_schema_is_still_checked(home: Any, settings: Any) -> None:
    """The SDK is handed only the schemas that declare an `x-mcp-header` (the check walks every
    schema it gets, on every call); one a catalog tool declares is still enforced: a request whose
    Mcp-Param header disagrees with its argument is refused before the tool runs, and nothing is
    created, while the agreeing one is answered."""
    from tests.conftest import catalog_text

    text = catalog_text().replace(
        'properties.log_lines = { type = "integer",',
        'properties.log_lines = { "x-mcp-header" = "Log-Lines", type = "integer",')
    assert "x-mcp-header" in text
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(text)
    cp = ControlPlane(settings)
    async with serving(cp) as server, httpx.AsyncClient() as http:
        call = {"name": "exercise", "arguments": {"log_lines": 3}}
        bad = await post_modern(http, server.url, "tools/call", call, **{"Mcp-Param-Log-Lines": "4"})
        assert bad.status_code == 400 and "Mcp-Param-Log-Lines" in bad.text
        assert cp.store.tasks.list(cp.settings.default_owner) == []
        good = await post_modern(http, server.url, "tools/call", call, **{"Mcp-Param-Log-Lines": "3"})
        assert good.status_code == 200 and '"isError":false' in good.text.replace(" ", "")
        assert len(cp.store.tasks.list(cp.settings.default_owner)) == 1
