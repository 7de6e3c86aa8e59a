"""The operator's view without a browser: /metrics over HTTP, the dashboard's sign-in, ownership,
CSRF and loopback rules, task traces (OpenTelemetry's in-memory exporter), and
`controlplane tasks watch` rendered by rich against a real server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving

pytestmark = pytest.mark.anyio


def scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def base(url: str) -> str:
    return url.removesuffix("/mcp")


async def wait_state(agent: Agent, task_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
    return await agent.wait(task_id, states, timeout)


# ---- /metrics -----------------------------------------------------------------------------------
async def test_metrics_follow_a_task_from_submit_to_its_end(http_server: Any) -> None:
    root = base(http_server.url)
    async with httpx.AsyncClient() as http, Client(http_server.url) as client:
        before = scrape((await http.get(f"{root}/metrics")).text)
        agent = Agent(client)
        tid = await agent.submit("exercise", inputs=dict(progress_steps=2, sleep_s=0.2))
        await wait_state(agent, tid, {"succeeded"})
        await agent.call("get_task_status", task_id=tid)
        r = await http.get(f"{root}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = scrape(r.text)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("controlplane_submits_total", tool="exercise") == 1
    assert grew("controlplane_completions_total", tool="exercise", outcome="succeeded") == 1
    assert grew("controlplane_queue_wait_seconds_count", resource_class="cpu_small") == 1
    assert grew("controlplane_launch_seconds_count", provider="local") == 1
    assert grew("controlplane_provider_calls_total", provider="local", op="launch") == 1
    assert grew("controlplane_provider_calls_total", provider="local", op="poll") >= 1
    assert grew("controlplane_runner_callback_seconds_count", route="claim") == 1
    assert grew("controlplane_runner_callback_seconds_count", route="events") >= 1
    assert grew("controlplane_reconcile_cycle_seconds_count") >= 1
    assert grew("controlplane_mcp_request_seconds_count", method="tools/call") >= 3
    # read from the database at scrape time: this test's store holds the one task
    assert value(after, "controlplane_tasks", state="succeeded", tool="exercise") == 1
    assert value(after, "controlplane_slots", resource_class="cpu_small") == 2
    assert value(after, "controlplane_queue_depth", resource_class="cpu_small") == 0


async def test_metrics_off_serves_nothing_and_counts_nothing(settings: Settings) -> None:
    cp = ControlPlane(settings.model_copy(update={"metrics": False}))
    try:
        async with serving(cp) as server, httpx.AsyncClient() as http, Client(server.url) as client:
            assert (await http.get(f"{base(server.url)}/metrics")).status_code == 404
            from controlplane.ops import metrics

            assert not metrics.enabled()
            await Agent(client).submit("exercise")
    finally:
        ControlPlane(settings)  # metrics are per process: on again for the tests that follow


# ---- the dashboard over plain HTTP --------------------------------------------------------------
@pytest.fixture
def token_cp(home: Path) -> ControlPlane:
    return ControlPlane(Settings(home=home, auth_tokens="tok-alice=alice,tok-bob=bob", **FAST))


def csrf_of(html: str) -> str:
    m = re.search(r'data-csrf="([^"]+)"', html)
    assert m, html[:500]
    return m.group(1)


async def sign_in(http: httpx.AsyncClient, root: str, token: str) -> httpx.Response:
    return await http.post(f"{root}/dashboard/login", data={"token": token})


async def test_dashboard_sign_in_keeps_the_token_out_of_the_cookie_and_tasks_to_their_owner(token_cp: ControlPlane) -> None:
    async with serving(token_cp) as server:
        root = base(server.url)
        async with Client(server.url, auth="tok-alice") as alice_mcp:
            alice = Agent(alice_mcp)
            running = await alice.submit("exercise", inputs=dict(sleep_s=60))
            done = await alice.submit("exercise", inputs=dict(log_lines=3, artifact_names=["out.txt"]))
            await wait_state(alice, done, {"succeeded"})
            await wait_state(alice, running, {"running"})

            async with httpx.AsyncClient(headers={"Accept": "text/html"}) as anon:
                r = await anon.get(f"{root}/dashboard")
                assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
                r = await sign_in(anon, root, "tok-nobody")
                assert r.status_code == 401 and "tok-nobody" not in r.text and "cp_dashboard" not in r.cookies
                r = await anon.get(f"{root}/dashboard/tasks/{done}")
                assert r.status_code == 303

            async with httpx.AsyncClient() as bob:
                assert (await sign_in(bob, root, "tok-bob")).status_code == 303
                r = await bob.get(f"{root}/dashboard/tasks/{done}")
                assert r.status_code == 404 and done not in r.text  # someone else's task: as unknown
                r = await bob.get(f"{root}/dashboard")
                assert r.status_code == 200 and done not in r.text and running not in r.text

            async with httpx.AsyncClient() as http:
                r = await sign_in(http, root, "tok-alice")
                assert r.status_code == 303
                cookie = r.headers["set-cookie"]
                assert "tok-alice" not in cookie
                for attr in ("HttpOnly", "SameSite=strict", "Path=/dashboard"):
                    assert attr.lower() in cookie.lower()
                page = await http.get(f"{root}/dashboard", params={"state": "succeeded"})
                assert page.status_code == 200 and done in page.text and running not in page.text
                assert "cpu_small" in page.text  # queues
                assert page.headers["content-security-policy"].startswith("default-src 'self'")
                task = await http.get(f"{root}/dashboard/tasks/{done}")
                assert task.status_code == 200
                assert "line 2" in task.text and "out.txt" in task.text and "/objects/" in task.text
                assert "submitted" in task.text and "succeeded" in task.text  # the timeline

                other = await http.get(f"{root}/dashboard/tasks/{running}")
                csrf = csrf_of(other.text)
                refused = await http.post(f"{root}/dashboard/tasks/{running}/cancel")
                assert refused.status_code == 403
                assert (await alice.call("get_task_status", task_id=running))["state"] == "running"
                ok = await http.post(f"{root}/dashboard/tasks/{running}/cancel", headers={"X-CSRF-Token": csrf})
                assert ok.status_code == 200 and ok.json()["acknowledged"] is True
                assert (await wait_state(alice, running, {"cancelled"}))["state"] == "cancelled"

                # a cookie changed by hand is no session
                http.cookies.set("cp_dashboard", http.cookies["cp_dashboard"][:-2] + "xx", path="/dashboard")
                r = await http.get(f"{root}/dashboard", headers={"Accept": "text/html"})
                assert r.status_code == 303


async def test_dashboard_streams_status_and_logs_until_the_task_ends(http_server: Any) -> None:
    root = base(http_server.url)
    async with Client(http_server.url) as client:
        agent = Agent(client)
        tid = await agent.submit("exercise", inputs=dict(sleep_s=1, progress_steps=4, log_lines=5))
        events: list[str] = []
        async with httpx.AsyncClient(timeout=30) as http:
            async with http.stream("GET", f"{root}/dashboard/tasks/{tid}/stream") as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                async for line in r.aiter_lines():
                    events.append(line)
                    if line == "event: end":
                        break
    text = "\n".join(events)
    assert '"state": "succeeded"' in text
    assert "line 4" in text
    assert text.index('"state": "running"') < text.index('"state": "succeeded"') if '"running"' in text else True


async def test_the_dashboard_and_metrics_answer_loopback_clients_unless_opened(settings: Settings) -> None:
    from controlplane.http.listener import Listener
    from controlplane.serve import http_app

    for opened in (False, True):
        cp = ControlPlane(settings.model_copy(update={"dashboard_open": opened, "metrics_open": opened}))
        listener = Listener("127.0.0.1", 0)
        try:
            app = http_app(cp, listener, "127.0.0.1")
            far = httpx.ASGITransport(app=app, client=("192.0.2.7", 50000))
            host = listener.url.removeprefix("http://")
            async with httpx.AsyncClient(transport=far, base_url=listener.url, headers={"Host": host}) as http:
                for path in ("/dashboard", "/metrics", "/dashboard/static/dashboard.js"):
                    r = await http.get(path)
                    assert r.status_code == (200 if opened else 404), (path, r.status_code)
        finally:
            listener.sock.close()


# ---- traces -------------------------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process (OpenTelemetry's rule)
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()


async def test_a_task_is_one_trace_from_submit_to_end_linked_to_its_mcp_request(settings: Settings, spans: Any) -> None:
    from controlplane.ops import traces

    cp = ControlPlane(settings.model_copy(update={"otel": True}))
    try:
        async with serving(cp) as server, Client(server.url) as client:
            agent = Agent(client)
            tid = await agent.submit("exercise", inputs=dict(sleep_s=0.2))
            await wait_state(agent, tid, {"succeeded"})
        trace_id, root = traces.ids(tid)
        ours = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
        names = [s.name for s in ours]
        for name in ("task.submit", "task.queued", "task.launch", "task.run"):
            assert names.count(name) == 1, names
        assert all(s.parent is not None and s.parent.span_id == root for s in ours)
        assert all(s.attributes["task.id"] == tid for s in ours)
        by_name = {s.name: s for s in ours}
        assert by_name["task.run"].attributes["task.outcome"] == "succeeded"
        assert by_name["task.queued"].end_time <= by_name["task.launch"].end_time <= by_name["task.run"].end_time
        # linked both ways with the request span fastmcp made for the tools/call
        [link] = by_name["task.submit"].links
        request = next(s for s in spans.get_finished_spans() if s.context.span_id == link.context.span_id)
        assert request.context.trace_id != trace_id and "submit_task" in request.name
        assert any(lk.context.span_id == by_name["task.submit"].context.span_id for lk in request.links)
    finally:
        traces.configure(False)


# ---- controlplane tasks watch -------------------------------------------------------------------
async def test_watch_shows_the_callers_tasks_with_progress_until_they_end(http_server: Any) -> None:
    from controlplane.watch import watch

    async with Client(http_server.url) as client:
        agent = Agent(client)
        slow = await agent.submit("exercise", inputs=dict(sleep_s=1.5, progress_steps=3))
        fast = await agent.submit("exercise", inputs=dict())
        console = Console(record=True, width=160, force_terminal=True, color_system=None)
        tasks = await watch(http_server.url, None, {"limit": 10}, console, interval=0.1, until_done=True)
    assert {t["task_id"] for t in tasks} == {slow, fast}
    frames = console.export_text()
    last = frames[frames.rindex(slow[:8]) - 200:]
    assert slow in frames and fast in frames
    assert re.search(re.escape(slow) + r".*running.*\s(33\.3|66\.7)\s", frames), frames[-3000:]
    assert re.search(re.escape(slow) + r".*succeeded.*100\.0", last)


async def test_dashboard_sign_in_with_oauth_tokens_keeps_their_scopes_and_expiry(home: Path) -> None:
    """Behind OAuth the dashboard takes the same access tokens as /mcp: the owner is the token's
    issuer and subject, a token without the read scope cannot sign in, one without the cancel scope
    reads but cannot cancel, and a session ends when its token does."""
    from tests.oidc import FakeIdP

    idp = FakeIdP().start()
    try:
        cp = ControlPlane(Settings(home=home, auth_issuer=idp.issuer, **FAST))
        async with serving(cp) as server:
            root = base(server.url)
            full = idp.token("alice", audience=server.url, scopes=["tasks:read", "tasks:submit", "tasks:cancel"])
            async with Client(server.url, auth=full) as mcp:
                alice = Agent(mcp)
                running = await alice.submit("exercise", inputs=dict(sleep_s=60))
                await wait_state(alice, running, {"running"})

                async with httpx.AsyncClient() as http:  # no read scope: no session
                    r = await sign_in(http, root, idp.token("alice", audience=server.url, scopes=["tasks:submit"]))
                    assert r.status_code == 403 and "tasks:read" in r.text and "cp_dashboard" not in r.cookies
                    r = await sign_in(http, root, idp.token("alice", audience="https://elsewhere.example/mcp",
                                                            scopes=["tasks:read"]))
                    assert r.status_code == 401 and "cp_dashboard" not in r.cookies

                async with httpx.AsyncClient() as reader:  # read only: sees its task, cannot cancel it
                    brief = idp.token("alice", audience=server.url, scopes=["tasks:read"], lifetime_s=3)
                    assert (await sign_in(reader, root, brief)).status_code == 303
                    page = await reader.get(f"{root}/dashboard/tasks/{running}")
                    assert page.status_code == 200 and running in page.text
                    r = await reader.post(f"{root}/dashboard/tasks/{running}/cancel",
                                          headers={"X-CSRF-Token": csrf_of(page.text)})
                    assert r.status_code == 403
                    assert (await alice.call("get_task_status", task_id=running))["state"] == "running"
                    await anyio.sleep(4)  # past the token's exp: the session is over too
                    r = await reader.get(f"{root}/dashboard/tasks/{running}", headers={"Accept": "text/html"})
                    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"

                async with httpx.AsyncClient() as operator:  # with the cancel scope it can
                    assert (await sign_in(operator, root, full)).status_code == 303
                    page = await operator.get(f"{root}/dashboard/tasks/{running}")
                    ok = await operator.post(f"{root}/dashboard/tasks/{running}/cancel",
                                             headers={"X-CSRF-Token": csrf_of(page.text)})
                    assert ok.status_code == 200 and ok.json()["acknowledged"] is True
                    assert (await wait_state(alice, running, {"cancelled"}))["state"] == "cancelled"
        assert cp.store.tasks.get(running).owner == f"{idp.issuer}#alice"
    finally:
        idp.stop()
