"""Following a sweep as one (docs/design/sweeps.md): wait_sweep streams a sweep's aggregated
progress, strictly increasing and at most 4 notifications a second, and answers its status when
every shard has ended, or says the wait gave up; another caller's sweep is NOT_FOUND; a client
that cancels the wait (`notifications/cancelled`) gets exactly one answer, CANCELLED, and the
sweep goes on. Through fastmcp's Client in memory and over HTTP in both protocol eras, and over
stdio to `controlplane serve`."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.conftest import FAST, ROOT, Agent, ServerProcess, fast_env, serving
from tests.test_cancel_timeout import progress_for
from tests.test_streaming import SERVE_STDIO, Recorder, assert_throttled, strictly_increasing
from tests.wire import LEGACY, MODERN, Legacy, Stdio, sse_events

pytestmark = pytest.mark.anyio

TOKENS = "tok-alice=alice,tok-bob=bob"
SHARDS = 20
# ~20 shards, each reporting 8 steps over 0.8 s: far more shard changes than 4 a second.
VARY = {"list": [{"result": {"i": i}} for i in range(SHARDS)]}
BASE = {"progress_steps": 8, "sleep_s": 0.8}


@asynccontextmanager
async def client_on(where: str, home: Path, rec: Recorder) -> AsyncIterator[Client]:
    """A fastmcp client of a server: in memory, over HTTP (either era), or over stdio."""
    home.mkdir(parents=True, exist_ok=True)
    if where == "stdio":
        stdio = StdioTransport(command=sys.executable, args=SERVE_STDIO, env=fast_env(home), cwd=str(ROOT))
        async with Client(stdio, message_handler=rec) as client:
            yield client
        return
    cp = ControlPlane(Settings(home=home, **FAST))
    if where == "memory":
        async with Client(build_server(cp), message_handler=rec) as client:
            yield client
        return
    async with serving(cp) as server:
        async with Client(server.url, mode=where.removeprefix("http-"), message_handler=rec) as client:
            yield client


@pytest.mark.parametrize("where", ["memory", "http-auto", "http-legacy", "stdio"])
async def test_wait_sweep_streams_the_aggregate_then_answers_its_status(home: Path, where: str) -> None:
    rec = Recorder()
    async with client_on(where, home, rec) as client:
        agent = Agent(client)
        s = await agent.call("submit_sweep", tool_name="exercise", base_inputs=BASE, vary=VARY)
        res = await client.call_tool("wait_sweep", {"sweep_id": s["sweep_id"], "timeout_s": 120},
                                     progress_handler=rec.handler)
        answered = time.monotonic()
        out = res.structured_content
        assert out["done"] is True and "message" not in out
        st = out["status"]
        assert st["sweep_id"] == s["sweep_id"] and st["counts"] == {"succeeded": SHARDS} and st["percent"] == 100
        assert st == {**await agent.call("get_sweep_status", sweep_id=s["sweep_id"]), "poll_after_ms": None}
    values = [p for _, p, _ in rec.progress]
    assert len(values) >= 4, rec.progress
    assert strictly_increasing(values) and 0 <= values[0] and values[-1] <= 100, values
    assert_throttled([t for t, _, _ in rec.progress])
    assert all(t <= answered for t, _, _ in rec.progress)  # none after the answer
    assert all(f"/{SHARDS} shards ended" in (m or "") for _, _, m in rec.progress)
    assert any("running" in (m or "") for _, _, m in rec.progress)


async def test_the_aggregate_is_read_at_most_4_times_a_second_however_many_shards_change(home: Path) -> None:
    """Every shard's progress pokes the follower; it reads the sweep's counts (one GROUP BY) at
    most 4 times a second, and never the shards' rows one by one."""
    cp = ControlPlane(Settings(home=home, **FAST))
    reads: list[float] = []
    counts = cp.store.sweeps.state_counts

    def counted(sweep_id: str) -> Any:
        reads.append(time.monotonic())
        return counts(sweep_id)

    cp.store.sweeps.state_counts = counted  # type: ignore[method-assign]
    changes = 0
    on_change = cp.store.on_change

    def heard(task_id: str) -> None:
        nonlocal changes
        changes += 1
        assert on_change is not None
        on_change(task_id)

    cp.store.on_change = heard
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        s = await agent.call("submit_sweep", tool_name="exercise", base_inputs={"progress_steps": 20, "sleep_s": 1},
                             vary=VARY, max_parallel=8)
        started, reads[:] = time.monotonic(), []
        out = await agent.call("wait_sweep", sweep_id=s["sweep_id"], timeout_s=120)
        took = time.monotonic() - started
    assert out["done"] is True
    assert changes > 4 * took, (changes, took)  # far more shard changes than reads allowed...
    assert len(reads) <= 4 * took + 3, (len(reads), took)  # ...and the reads stay throttled


async def test_a_wait_that_gives_up_says_so_and_leaves_the_sweep_running(home: Path) -> None:
    rec = Recorder()
    async with client_on("memory", home, rec) as client:
        agent = Agent(client)
        s = await agent.call("submit_sweep", tool_name="exercise", base_inputs={"sleep_s": 30},
                             vary={"list": [{}, {}, {}]})
        started = time.monotonic()
        out = (await client.call_tool("wait_sweep", {"sweep_id": s["sweep_id"], "timeout_s": 1.5},
                                      progress_handler=rec.handler)).structured_content
        assert 1.4 <= time.monotonic() - started < 10
        assert out["done"] is False and "still running after 1.5 s" in out["message"]
        assert out["status"]["done"] is False and out["status"]["ended"] == 0
        assert len(rec.progress) >= 1
        st = await agent.call("get_sweep_status", sweep_id=s["sweep_id"])
        assert st["ended"] == 0 and "cancelled" not in st["counts"]  # leaving the wait stopped nothing
        assert (await agent.call("cancel_sweep", sweep_id=s["sweep_id"]))["cancelled"] == 3
        bad = await agent.error("wait_sweep", sweep_id=s["sweep_id"], timeout_s=0)
        assert bad["code"] == "INVALID_REQUEST"


@pytest.fixture
def server(server_process: ServerProcess, home: Path) -> ServerProcess:
    server_process.env = fast_env(home, auth_tokens=TOKENS)
    return server_process.start()


async def test_another_callers_sweep_is_not_found(server: ServerProcess) -> None:
    async with Client(server.url, auth="tok-alice") as a, Client(server.url, auth="tok-bob") as b:
        alice, bob = Agent(a), Agent(b)
        s = await alice.call("submit_sweep", tool_name="exercise", vary={"list": [{"sleep_s": 0.2}] * 2})
        theirs = await bob.error("wait_sweep", sweep_id=s["sweep_id"], timeout_s=5)
        missing = await bob.error("wait_sweep", sweep_id="swp_" + "2" * 26, timeout_s=5)
        assert theirs == missing == {"code": "NOT_FOUND", "message": "sweep not found"}
        mine: dict[str, Any] = await alice.call("wait_sweep", sweep_id=s["sweep_id"], timeout_s=60)
        assert mine["done"] is True and mine["status"]["counts"] == {"succeeded": 2}


# ---- cancelling a wait (docs/design/errors-and-cancellation.md) ----------------------------------
WAITED = {"progress_steps": 12, "sleep_s": 4}  # each shard about 3 s from its end when the wait is cancelled
TWO = {"list": [{"result": {"i": 0}}, {"result": {"i": 1}}]}


def assert_cancelled(answer: dict[str, Any], sweep_id: str) -> None:
    assert answer["result"]["isError"] is True, answer
    err = answer["result"]["structuredContent"]
    assert err["code"] == "CANCELLED" and err["sweep_id"] == sweep_id, err
    assert "sweep was not" in err["message"] and "cancel_sweep" in err["hint"]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_cancelled_wait_over_stdio_answers_cancelled_once_and_the_sweep_goes_on(home: Path, era: str) -> None:
    async with Stdio(fast_env(home, keepalive_s=0.3), ROOT, era) as rpc:
        sid = (await rpc.call("submit_sweep", tool_name="exercise", base_inputs=WAITED, vary=TWO))["sweep_id"]
        wait = rpc.send("tools/call", {"name": "wait_sweep", "arguments": {"sweep_id": sid, "timeout_s": 60},
                                       "_meta": {"progressToken": "w"}})
        while len(progress_for(rpc.messages, "w")) < 2:  # the wait is streaming
            await anyio.sleep(0.02)
        rpc.notify("notifications/cancelled", {"requestId": wait, "reason": "bored"})
        answer = await rpc.answer(wait, timeout=10)
        assert_cancelled(answer, sid)
        assert ("resultType" in answer["result"]) == (era == MODERN)  # shaped for its era
        st = await rpc.call("get_sweep_status", sweep_id=sid)
        assert st["done"] is False and "cancelled" not in st["counts"], st  # the wait was cancelled, not the sweep
        done = await rpc.call("wait_sweep", sweep_id=sid, timeout_s=60)
        assert done["done"] is True and done["status"]["counts"] == {"succeeded": 2}
        await anyio.sleep(0.5)
        assert rpc.answers(wait) == [answer]  # exactly one answer, even once the sweep is over
        assert max(progress_for(rpc.messages, "w")) < rpc.messages.index(answer)  # no progress after it


async def test_a_cancelled_wait_over_legacy_http_answers_cancelled_once_and_the_sweep_goes_on(
        http_server: Any) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = Legacy(http, http_server.url)
        await rpc.start()

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            out: dict[str, Any] = (await rpc.request("tools/call", {"name": tool, "arguments": arguments}))
            return out["result"]["structuredContent"]  # type: ignore[no-any-return]

        sid = (await call("submit_sweep", tool_name="exercise", base_inputs=WAITED, vary=TWO))["sweep_id"]
        body = rpc.body("tools/call", {"name": "wait_sweep", "arguments": {"sweep_id": sid, "timeout_s": 60},
                                       "_meta": {"progressToken": "w"}})
        messages: list[dict[str, Any]] = []
        async with http.stream("POST", rpc.url, json=body, headers=rpc.headers()) as r:
            async for event in sse_events(r):
                if event.data is None:
                    continue
                messages.append(event.data)
                if len(messages) == 2:
                    cancelled = await http.post(rpc.url, headers=rpc.headers(), json={
                        "jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": body["id"], "reason": "bored"}})
                    assert cancelled.status_code == 202
        answers = [m for m in messages if m.get("id") == body["id"]]
        assert len(answers) == 1 and messages[-1] is answers[0], messages  # one answer, nothing after it
        assert_cancelled(answers[0], sid)
        st = await call("get_sweep_status", sweep_id=sid)
        assert st["done"] is False and "cancelled" not in st["counts"], st
        done = await call("wait_sweep", sweep_id=sid, timeout_s=60)
        assert done["done"] is True and done["status"]["counts"] == {"succeeded": 2}
