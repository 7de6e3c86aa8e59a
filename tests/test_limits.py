"""Limits per caller (the design's figures as examples: 10 submits a minute, 100 a day, 3 streams):
counted in the database, so they hold under concurrent callers and across replicas sharing it;
each refusal is LIMIT_EXCEEDED with the limit and when to try again, and changes nothing; an
operator overrides them per caller from the command line; and a caller without limits costs the
database nothing more."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from fastmcp_tasks.client import TasksClientExtension

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store import queries as q
from tests.conftest import FAST, ROOT, Agent, fast_env, record_statements, serving
from tests.wire import Legacy

pytestmark = pytest.mark.anyio

SLOW = {"sleep_s": 120, "progress_steps": 120}


def settings_of(home: Path, **limits: Any) -> Settings:
    return Settings(home=home, **{**FAST, **limits})


async def call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any]]:
    res = await client.call_tool(tool, args, raise_on_error=False)
    return res.is_error, json.loads(res.content[0].text)


def assert_refused(err: dict[str, Any], limit: str, maximum: int, *, within_s: float) -> None:
    assert err["code"] == "LIMIT_EXCEEDED", err
    assert err["limit"] == limit and err["max"] == maximum, err
    assert isinstance(err["retry_after_s"], int) and 1 <= err["retry_after_s"] <= within_s, err
    assert err["hint"] and "Traceback" not in err["message"]


async def test_ten_a_minute_holds_for_twenty_concurrent_submits_across_two_replicas(home: Path) -> None:
    # Two control planes on one database (two replicas); both serve the same caller at once.
    replicas = [ControlPlane(settings_of(home, limit_submits_per_minute=10)) for _ in range(2)]
    answers: list[tuple[str, bool, dict[str, Any]]] = []
    async with Client(build_server(replicas[0])) as c0, Client(build_server(replicas[1])) as c1:
        async def submit(i: int) -> None:
            is_error, data = await call((c0, c1)[i % 2], "submit_task", tool_name="exercise", inputs={},
                                        idempotency_key=f"key-{i}")
            answers.append((f"key-{i}", is_error, data))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(submit, i)
    created = [a for a in answers if not a[1]]
    refused = [a for a in answers if a[1]]
    assert len(created) == 10 and len(refused) == 10
    for _, _, err in refused:
        assert_refused(err, "submits_per_minute", 10, within_s=60)
    store = replicas[0].store
    assert sum(store.tasks.count_by_state().values()) == 10
    # A refused submit wrote nothing: its idempotency key is still unused.
    for key, _, _ in refused:
        assert store.tasks.find_idempotent("local", "exercise", key) is None
    for key, _, data in created:
        assert store.tasks.find_idempotent("local", "exercise", key).task_id == data["task_id"]


async def test_a_day_limit_counts_every_way_of_submitting(home: Path) -> None:
    cp = ControlPlane(settings_of(home, limit_submits_per_day=3))
    async with Client(build_server(cp), extensions=[TasksClientExtension()]) as native, \
            Client(build_server(cp)) as plain:
        assert not (await call(plain, "submit_task", tool_name="exercise", inputs={}))[0]
        assert not (await call(plain, "exercise"))[0]  # a catalog tool, two-stage answer
        assert not (await call(native, "exercise"))[0]  # a native task (2026-07-28 tasks extension)
        for client, tool, args in ((plain, "submit_task", {"tool_name": "exercise", "inputs": {}}),
                                   (plain, "exercise", {}), (native, "exercise", {})):
            is_error, err = await call(client, tool, **args)
            assert is_error, (tool, err)
            assert_refused(err, "submits_per_day", 3, within_s=86400)
            assert err["retry_after_s"] > 86000  # the first of the three leaves the window in a day
    assert sum(cp.store.tasks.count_by_state().values()) == 3


async def test_tasks_in_flight_and_a_refused_key_stays_free(home: Path) -> None:
    cp = ControlPlane(settings_of(home, limit_tasks_in_flight=2))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        first = await agent.submit(inputs=SLOW)
        await agent.submit(inputs=SLOW)
        is_error, err = await call(client, "submit_task", tool_name="exercise", inputs=SLOW, idempotency_key="third")
        assert is_error
        assert_refused(err, "tasks_in_flight", 2, within_s=300)
        await agent.call("cancel_task", task_id=first)
        assert (await agent.wait(first))["state"] == "cancelled"  # no longer in flight
        third = await agent.call("submit_task", tool_name="exercise", inputs=SLOW, idempotency_key="third")
        assert "deduplicated" not in third  # the refused submit had not used the key
        for tid in (third["task_id"],):
            await agent.call("cancel_task", task_id=tid)


async def test_three_streams_across_two_replicas(home: Path) -> None:
    replicas = [ControlPlane(settings_of(home, limit_streams=3)) for _ in range(2)]
    async with Client(build_server(replicas[0])) as c0, Client(build_server(replicas[1])) as c1:
        tid = await Agent(c0).submit(inputs=SLOW)
        waits: list[tuple[bool, dict[str, Any]]] = []

        async def wait(client: Client) -> None:
            waits.append(await call(client, "wait_task", task_id=tid, timeout_s=60))

        async with anyio.create_task_group() as tg:
            for client in (c0, c0, c1):
                tg.start_soon(wait, client)
            deadline = time.monotonic() + 20
            while replicas[0].store.callers.open_streams("local") < 3:
                assert time.monotonic() < deadline, "the three waits did not start"
                await anyio.sleep(0.05)
            for client in (c1, c0):  # a fourth on either replica is refused
                is_error, err = await call(client, "wait_task", task_id=tid, timeout_s=60)
                assert is_error
                assert_refused(err, "streams", 3, within_s=90)
            # Polling is not a stream: still answered.
            assert not (await call(c1, "get_task_status", task_id=tid))[0]
            await Agent(c1).call("cancel_task", task_id=tid)  # the task ends: so do the three waits
        assert [w[0] for w in waits] == [False] * 3 and all(w[1]["done"] for w in waits)
        assert replicas[0].store.callers.open_streams("local") == 0  # each wait gave its place back
        assert (await call(c1, "wait_task", task_id=tid, timeout_s=5))[1]["done"] is True


async def test_no_streams_at_all_refuses_both_eras_waits(home: Path) -> None:
    cp = ControlPlane(settings_of(home, limit_streams=0))
    async with serving(cp) as server:
        async with Client(server.url) as client:
            tid = await Agent(client).submit()
            is_error, err = await call(client, "wait_task", task_id=tid, timeout_s=5)
        assert is_error and err["code"] == "LIMIT_EXCEEDED" and err["limit"] == "streams" and err["max"] == 0
        assert "retry_after_s" not in err and err["hint"]
        async with httpx.AsyncClient() as h:
            rpc = Legacy(h, server.url)
            await rpc.start()
            answer = await rpc.request("tasks/result", {"taskId": tid})  # 2025-11-25's waiting method
        assert answer["error"]["code"] == -32000 and answer["error"]["data"]["code"] == "LIMIT_EXCEEDED"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`controlplane limits ...`, as an operator runs it (beside the server, same settings)."""
    return subprocess.run([sys.executable, "-m", "controlplane.cli", "limits", *args, "--home", str(home)],
                          env=fast_env(home, limit_submits_per_minute=100), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


async def test_an_operator_sets_and_lifts_one_callers_limit_from_the_command_line(home: Path) -> None:
    cp = ControlPlane(settings_of(home, auth_tokens="tok-a=alice,tok-b=bob", limits_refresh_s=0.2,
                                  limit_submits_per_minute=100))
    async with serving(cp) as server:
        assert cli(home, "set", "alice", "--submits-per-minute", "1", "--streams", "2").returncode == 0
        listed = json.loads(cli(home, "list", "--json").stdout)
        assert listed["defaults"]["submits_per_minute"] == 100
        assert listed["callers"] == [{"owner": "alice", "submits_per_minute": 1, "submits_per_day": None,
                                      "tasks_in_flight": None, "streams": 2}]
        await anyio.sleep(0.6)  # every replica reads the overrides again within limits_refresh_s
        async with Client(server.url, auth="tok-a") as a, Client(server.url, auth="tok-b") as b:
            assert not (await call(a, "submit_task", tool_name="exercise", inputs={}))[0]
            is_error, err = await call(a, "submit_task", tool_name="exercise", inputs={})
            assert is_error
            assert_refused(err, "submits_per_minute", 1, within_s=60)
            for _ in range(3):  # bob has the default
                assert not (await call(b, "submit_task", tool_name="exercise", inputs={}))[0]

            assert cli(home, "set", "alice", "--submits-per-minute", "none").returncode == 0  # no limit for alice
            await anyio.sleep(0.6)
            for _ in range(3):
                assert not (await call(a, "submit_task", tool_name="exercise", inputs={}))[0]
            assert cli(home, "clear", "alice").returncode == 0
            assert cli(home, "clear", "alice").returncode == 1  # nothing left to clear
    bad = cli(home, "set", "alice", "--submits-per-minute", "-5")
    assert bad.returncode == 2 and "expected" in bad.stderr


async def test_a_caller_without_limits_costs_the_database_nothing_more(home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit statements run only for a caller that has a limit (flip: with limits, they run)."""
    limit_statements = {id(q.NTH_NEWEST_SUBMIT), id(q.IN_FLIGHT), id(q.OPEN_STREAMS), id(q.INSERT_STREAM)}

    async def statements_of_calls(cp: ControlPlane) -> list[Any]:
        seen = record_statements(cp, monkeypatch)
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit()
            await agent.call("get_task_status", task_id=tid)
            await agent.call("wait_task", task_id=tid, timeout_s=0.2)
        return seen

    off = await statements_of_calls(ControlPlane(settings_of(home)))
    assert not [s for s in off if id(s) in limit_statements or (isinstance(s, str) and s.startswith(("caller:",
                                                                                                     "streams:")))]
    on = await statements_of_calls(ControlPlane(settings_of(home, limit_submits_per_day=100, limit_tasks_in_flight=50,
                                                            limit_streams=3)))
    assert {id(s) for s in on} >= limit_statements


async def test_limits_are_per_oauth_caller_in_both_eras(home: Path) -> None:
    from tests.oidc import FakeIdP

    idp = FakeIdP().start()
    try:
        cp = ControlPlane(settings_of(home, auth_issuer=idp.issuer, auth_jwks_uri=idp.jwks_uri,
                                      limit_submits_per_minute=2))
        async with serving(cp) as server:
            scopes = ["tasks:submit", "tasks:read"]
            alice = Client(server.url, auth=idp.token("alice", audience=server.url, scopes=scopes), mode="legacy")
            bob = Client(server.url, auth=idp.token("bob", audience=server.url, scopes=scopes), mode="auto")
            async with alice, bob:
                for _ in range(2):
                    assert not (await call(alice, "submit_task", tool_name="exercise", inputs={}))[0]
                is_error, err = await call(alice, "exercise")  # 2025-11-25, a catalog tool
                assert is_error
                assert_refused(err, "submits_per_minute", 2, within_s=60)
                for _ in range(2):  # bob is another caller
                    assert not (await call(bob, "exercise"))[0]
                assert (await call(bob, "exercise"))[1]["code"] == "LIMIT_EXCEEDED"
    finally:
        idp.stop()
