"""Pushed progress and streaming waits (docs/design/streaming.md): wait_task streams a
task's progress and returns its result; a token's progress values strictly increase (MCP), on
every wire, whatever the task does; notifications come at most 4 a second and never after the
answer; a wait that times out says so; leaving a wait never cancels the task; 2025-11-25 streams
resume with Last-Event-ID; the two-stage answer's follow-up notifications reach clients that ask."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp
import pytest
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from fastmcp.client.transports import StdioTransport

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.mcp.streaming import NOTIFY_META
from controlplane.settings import Settings
from tests import steady_tool
from tests.conftest import FAST, ROOT, Agent, ServerProcess, catalog_text, fast_env, serving
from tests.wire import Legacy, sse_events

pytestmark = pytest.mark.anyio


class Recorder(MessageHandler):
    """Every progress notification the client gets, with when it got it."""

    def __init__(self) -> None:
        self.progress: list[tuple[float, float, str | None]] = []
        self.seen_at: list[float] = []  # every progress notification the session saw

    async def on_progress(self, message: Any) -> None:
        self.seen_at.append(time.monotonic())

    async def handler(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((time.monotonic(), progress, message))


def strictly_increasing(values: list[float]) -> bool:
    return all(b > a for a, b in pairwise(values))


def assert_throttled(times: list[float]) -> None:
    """At most 4 a second: no five notifications within any one second (a little slack for the
    scheduler), and no more than 4 per second on average."""
    for i in range(len(times) - 5):
        assert times[i + 5] - times[i] >= 0.9, f"6 notifications within {times[i + 5] - times[i]:.2f} s"
    if len(times) > 1:
        assert len(times) - 1 <= 4 * (times[-1] - times[0]) + 1


async def test_wait_task_streams_progress_then_returns_the_result(cp: ControlPlane) -> None:
    rec = Recorder()
    async with Client(build_server(cp), message_handler=rec) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"progress_steps": 40, "sleep_s": 3, "result": {"k": "v"}})
        res = await client.call_tool("wait_task", {"task_id": tid, "timeout_s": 60}, progress_handler=rec.handler)
        answered = time.monotonic()
        out = res.structured_content
        assert out["done"] is True and out["state"] == "succeeded" and out["result"]["k"] == "v"
        assert res.meta["duration"] > 2000 and "progressToken" in res.meta
        await anyio.sleep(1.0)  # anything still in flight would arrive now
    values = [p for _, p, _ in rec.progress]
    assert len(values) >= 5, rec.progress  # 40 steps over 3 s, coalesced
    assert strictly_increasing(values) and values[-1] <= 100
    assert any("step" in (m or "") for _, _, m in rec.progress)
    assert_throttled([t for t, _, _ in rec.progress])
    assert all(t <= answered for t, _, _ in rec.progress)
    assert len(rec.seen_at) == len(rec.progress) and max(rec.seen_at) <= answered  # none after the answer


async def test_wait_task_times_out_with_the_latest_status_and_the_task_goes_on(cp: ControlPlane) -> None:
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"progress_steps": 20, "sleep_s": 4})
        await agent.wait(tid, {"running"})
        out = await agent.call("wait_task", task_id=tid, timeout_s=0.5)
        assert out["done"] is False and "still running" in out["message"]
        assert out["status"]["state"] == "running" and out["status"]["task_id"] == tid
        out = await agent.call("wait_task", task_id=tid, timeout_s=60)
        assert out["done"] is True and out["state"] == "succeeded"


async def test_wait_task_refuses_bad_input_and_other_callers_tasks(cp: ControlPlane) -> None:
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        assert (await agent.error("wait_task", task_id="tsk_" + "c" * 26))["code"] == "NOT_FOUND"
        assert (await agent.error("wait_task", task_id="x", timeout_s=-1))["code"] == "INVALID_REQUEST"
        assert (await agent.error("wait_task", task_id="x", timeout_s=10**9))["code"] == "INVALID_REQUEST"
        bad = await agent.error("wait_task", task_id="tsk_" + "c" * 26, extra=True)
        assert bad["code"] == "INVALID_REQUEST" and "extra" in bad["message"]


async def test_a_silent_wait_is_kept_alive(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, keepalive_s=0.4, **FAST))
    rec = Recorder()
    async with Client(build_server(cp)) as client:
        tid = await Agent(client).submit(inputs={"sleep_s": 30})  # no progress of its own
        await Agent(client).wait(tid, {"running"})
        out = (await client.call_tool("wait_task", {"task_id": tid, "timeout_s": 2},
                                      progress_handler=rec.handler)).structured_content
        assert out["done"] is False
        # the first notification at once, then one per keep-alive interval of silence
        assert len(rec.progress) >= 4, rec.progress
        assert all("running" in (m or "") for _, _, m in rec.progress)
        await Agent(client).call("cancel_task", task_id=tid)


async def test_a_wait_finds_the_end_even_when_the_hub_cannot_read_it(home: Path) -> None:
    """The hub's read of a changed task fails (a database hiccup): the wait learns the outcome
    from its own read in the next quiet spell, not at the end of its timeout."""
    cp = ControlPlane(Settings(home=home, keepalive_s=0.4, **FAST))

    def failing_read(task_id: str) -> None:
        raise OSError("database unavailable")

    cp.hub._fetch = failing_read
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 0.5, "result": {"k": "v"}})
        started = time.monotonic()
        out = await agent.call("wait_task", task_id=tid, timeout_s=60)
        assert out["done"] is True and out["state"] == "succeeded" and out["result"]["k"] == "v"
        assert time.monotonic() - started < 20


async def test_leaving_a_wait_never_cancels_the_task(server_process: ServerProcess) -> None:
    server = server_process.start()
    async with mcp.Client(server.url) as client:
        sub = (await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {
            "progress_steps": 10, "sleep_s": 3}})).structured_content
        got: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            got.append(progress)

        with anyio.move_on_after(1.0):  # the agent gives up on the wait (its HTTP stream closes)
            await client.call_tool("wait_task", {"task_id": sub["task_id"], "timeout_s": 60},
                                   progress_callback=on_progress)
        assert got, "no progress streamed before the client left"
    async with mcp.Client(server.url) as client:  # the polling fallback: the task is there, by id
        st = (await client.call_tool("get_task_status", {"task_id": sub["task_id"]})).structured_content
        assert st["state"] in ("running", "succeeded")
        out = (await client.call_tool("wait_task", {"task_id": sub["task_id"], "timeout_s": 60})).structured_content
        assert out["done"] is True and out["state"] == "succeeded"


# ---- the 2025-11-25 era on the wire --------------------------------------------------------------
async def test_a_legacy_stream_resumes_with_last_event_id(http_server: Any) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = Legacy(http, http_server.url)
        await rpc.start()
        sub = (await rpc.request("tools/call", {"name": "submit_task", "arguments": {
            "tool_name": "exercise", "inputs": {"progress_steps": 12, "sleep_s": 3}}}))["result"]["structuredContent"]
        body = rpc.body("tools/call", {"name": "wait_task", "arguments": {"task_id": sub["task_id"], "timeout_s": 60},
                                       "_meta": {"progressToken": "w1"}})
        before: list[dict[str, Any]] = []
        last_id = None
        async with http.stream("POST", rpc.url, json=body, headers=rpc.headers()) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for event in sse_events(r):
                assert event.id is not None  # every event can be resumed from
                last_id = event.id
                if event.data is not None:
                    assert event.data.get("method") == "notifications/progress"
                    before.append(event.data["params"])
                    break  # the connection drops after the first progress notification
        await anyio.sleep(1.0)  # the task advances while nobody listens
        after: list[dict[str, Any]] = []
        answer = None
        async with http.stream("GET", rpc.url, headers=rpc.headers(**{"Last-Event-ID": last_id})) as r:
            assert r.status_code == 200
            async for event in sse_events(r):
                if event.data is None:
                    continue
                if event.data.get("id") == body["id"]:
                    answer = event.data
                    break
                after.append(event.data["params"])
        assert answer is not None and answer["result"]["structuredContent"]["done"] is True
        assert answer["result"]["structuredContent"]["state"] == "succeeded"
        assert after, "nothing was replayed or streamed after the reconnect"
        values = [p["progress"] for p in before + after]
        assert strictly_increasing(values) and all(p["progressToken"] == "w1" for p in before + after)


async def test_seed_000_follow_up_notifications(http_server: Any) -> None:
    """A legacy client that asks (progressToken + the notify flag) gets the immediate answer, then
    progress on its session's stream, then `notifications/tool_result` with the result."""
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = Legacy(http, http_server.url)
        await rpc.start()
        messages: list[tuple[float, dict[str, Any]]] = []
        listening = anyio.Event()

        async def listen() -> None:
            async with http.stream("GET", rpc.url, headers=rpc.headers()) as r:
                assert r.status_code == 200
                listening.set()
                async for event in sse_events(r):
                    if event.data is not None:
                        messages.append((time.monotonic(), event.data))

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            await listening.wait()
            answer = await rpc.request("tools/call", {"name": "exercise", "arguments": {
                "progress_steps": 8, "sleep_s": 1.5, "result": {"z": 26}},
                "_meta": {"progressToken": "t1", NOTIFY_META: True}})
            sub = answer["result"]["structuredContent"]
            assert sub["state"] == "queued"  # stage one: at once
            deadline = time.monotonic() + 60
            while not any(m["method"] == "notifications/tool_result" for _, m in messages):
                assert time.monotonic() < deadline, messages
                await anyio.sleep(0.05)
            await anyio.sleep(0.8)
            tg.cancel_scope.cancel()
        progress = [(t, m["params"]) for t, m in messages if m["method"] == "notifications/progress"]
        [(t_final, final)] = [(t, m["params"]) for t, m in messages if m["method"] == "notifications/tool_result"]
        assert final["task_id"] == sub["task_id"] and final["state"] == "succeeded"
        assert final["result"]["result"]["z"] == 26
        assert progress and all(p["progressToken"] == "t1" for _, p in progress)
        values = [p["progress"] for _, p in progress]
        assert strictly_increasing(values), values
        assert_throttled([t for t, _ in progress])
        assert all(t <= t_final for t, _ in progress)  # nothing after the final notification


async def test_without_the_flag_there_is_no_follow_up(http_server: Any) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = Legacy(http, http_server.url)
        await rpc.start()
        messages: list[dict[str, Any]] = []

        async def listen() -> None:
            async with http.stream("GET", rpc.url, headers=rpc.headers()) as r:
                async for event in sse_events(r):
                    if event.data is not None:
                        messages.append(event.data)

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            sub = (await rpc.request("tools/call", {"name": "exercise", "arguments": {"sleep_s": 0.3},
                                                    "_meta": {"progressToken": "t2"}}))["result"]["structuredContent"]
            out = (await rpc.request("tools/call", {"name": "wait_task", "arguments": {
                "task_id": sub["task_id"], "timeout_s": 30}}))["result"]["structuredContent"]
            assert out["state"] == "succeeded"
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
        assert messages == []



# ---- strictly increasing values, on every wire --------------------------------------------------
SERVE_STDIO = ["-m", "controlplane.cli", "serve", "--transport", "stdio"]


class TokenRecorder(MessageHandler):
    """Every progress notification the client gets, by progressToken, as (value, total, message)."""

    def __init__(self) -> None:
        self.by_token: dict[Any, list[tuple[float, float | None, str | None]]] = defaultdict(list)

    async def on_progress(self, message: Any) -> None:
        p = message.params
        self.by_token[p.progress_token].append((p.progress, p.total, p.message))


async def _ignore(progress: float, total: float | None, message: str | None) -> None:
    return None


@asynccontextmanager
async def client_over(transport: str, mode: str, home: Path, rec: MessageHandler) -> AsyncIterator[Client]:
    """A fastmcp client of a server with the `steady` tool and 0.3 s keep-alives: the server a
    subprocess on stdio, or this process's HTTP server."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + steady_tool.CATALOG_ENTRY)
    if transport == "stdio":
        stdio = StdioTransport(command=sys.executable, args=SERVE_STDIO, env=fast_env(home, keepalive_s=0.3),
                               cwd=str(ROOT))
        async with Client(stdio, mode=mode, message_handler=rec) as client:
            yield client
        return
    async with serving(ControlPlane(Settings(home=home, keepalive_s=0.3, **FAST))) as server:
        async with Client(server.url, mode=mode, message_handler=rec) as client:
            yield client


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_progress_values_strictly_increase_on_every_wire(home: Path, transport: str, mode: str) -> None:
    """A task whose first attempt fails at 60 %, whose retry starts again at 10 %, reports 50 % four
    times with new messages, goes quiet (keep-alives), steps back to 30 % and sits at 100 %: every
    token's values still rise with every notification, and `progress/total` stays its percent.
    On the 2025-11-25 era the two-stage follower of a catalog call is checked too."""
    rec = TokenRecorder()
    async with client_over(transport, mode, home, rec) as client:
        agent = Agent(client)
        tid = await agent.submit("steady", inputs={"fail_attempts": 1, "gap_s": 0.3, "quiet_s": 1.5})
        res = await client.call_tool("wait_task", {"task_id": tid, "timeout_s": 60}, progress_handler=_ignore)
        out = res.structured_content
        assert out["state"] == "succeeded" and out["result"]["attempt"] == 2, out
        followed = None
        if mode == "legacy":  # two-stage answer: the catalog call answers at once, a follower streams on
            res = await client.call_tool("steady", {"gap_s": 0.3, "quiet_s": 0.9}, progress_handler=_ignore,
                                         meta={NOTIFY_META: True})
            followed = res.structured_content["task_id"]
            assert (await agent.call("wait_task", task_id=followed, timeout_s=60))["state"] == "succeeded"
        await anyio.sleep(0.6)  # the follower's last notification, if any, arrives now
    # the first wait, then (legacy) the follower and the second wait (the client gives every call a token)
    waits = [seen for seen in rec.by_token.values() if any("reading" in (m or "") for _, _, m in seen)]
    assert len(waits) == (3 if followed else 1), dict(rec.by_token)
    for seen in rec.by_token.values():
        values = [v for v, _, _ in seen]
        assert strictly_increasing(values), values
        assert all(total == 100 for _, total, _ in seen) and 0 <= values[0] and values[-1] < 100.001
    wait = waits[0]
    shown = [round(v, 3) for v, _, _ in wait]  # what a client that prints the percent shows
    assert shown == sorted(shown)
    # the retry started again at 10 % and repeated 50 %: the value held at 60 (a millionth above
    # at each step) through the second attempt's reports and the quiet spell after "indexing"
    assert shown.count(60.0) >= 6, wait
    assert sum("indexing" in (m or "") for _, _, m in wait) >= 3, wait  # the report and keep-alives
    assert 100.0 in shown
