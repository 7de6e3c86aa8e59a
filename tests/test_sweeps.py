"""Sweeps (`submit_sweep`): one call for many tasks of one tool, followed as one. Through real MCP
clients (in memory to the server's factory, and over HTTP to `controlplane serve`) on the local
provider, on both engines: a list and a grid run to the end and page back in shard order, and a
200-shard sweep over HTTP returns every shard's result (100 on PostgreSQL); one
invalid shard, a queue too short or a caller's limit refuse the whole sweep and write nothing;
max_parallel holds; fail_fast and cancel_sweep end the rest; another caller's sweep is NOT_FOUND;
a server killed mid-sweep finishes it after its restart."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store.rows import TaskRow
from tests.conftest import FAST, Agent, ServerProcess, fast_env, serving, write_catalog

pytestmark = pytest.mark.anyio

TOKENS = "tok-alice=alice,tok-bob=bob"


@asynccontextmanager
async def agent_on(home: Path, **settings: Any) -> AsyncIterator[tuple[Agent, ControlPlane]]:
    """An MCP client of a server (in memory) with these settings, and its control plane."""
    cp = ControlPlane(Settings(home=home, **{**FAST, **settings}))
    async with Client(build_server(cp)) as client:
        yield Agent(client), cp


async def sweep(agent: Agent, vary: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return await agent.call("submit_sweep", tool_name="exercise", vary=vary, **kw)


async def finished(agent: Agent, sweep_id: str, timeout: float = 90) -> dict[str, Any]:
    """get_sweep_status once every shard has ended."""
    deadline = time.monotonic() + timeout
    while True:
        st = await agent.call("get_sweep_status", sweep_id=sweep_id)
        if st["done"]:
            return st
        assert time.monotonic() < deadline, f"sweep {sweep_id} not done after {timeout}s: {st}"
        await anyio.sleep(0.1)


async def all_results(agent: Agent, sweep_id: str, limit: int) -> list[dict[str, Any]]:
    """Every shard's result, page by page."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        args: dict[str, Any] = {"sweep_id": sweep_id, "limit": limit}
        if cursor:
            args["cursor"] = cursor
        page = await agent.call("get_sweep_result", **args)
        assert len(page["results"]) <= limit
        out += page["results"]
        cursor = page["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("get_sweep_result never ended")


def shards(cp: ControlPlane, sweep_id: str) -> list[TaskRow]:
    """The sweep's shards as the database holds them, in shard order."""
    return cp.store.sweeps.page(sweep_id, 0, 10_000)


def tasks_on_file(cp: ControlPlane) -> int:
    return sum(cp.store.tasks.count_by_state().values())


async def test_a_grid_and_a_list_run_to_the_end_and_page_back_in_shard_order(home: Path) -> None:
    async with agent_on(home) as (agent, cp):
        grid = await sweep(agent, {"grid": {"result": [{"k": 1}, {"k": 2}], "artifact_names": [["a.txt"], ["b.txt"]]}},
                           base_inputs={"sleep_s": 0.1}, tags=["scan"])
        listed = await sweep(agent, {"list": [{"result": {"i": i}} for i in range(3)]})
        assert grid["sweep_id"].startswith("swp_") and grid["shards"] == 4 and listed["shards"] == 3
        assert grid["estimated_runtime_seconds"] > 0 and grid["queue"] == "cpu_small"

        st = await finished(agent, grid["sweep_id"])
        assert st["counts"] == {"succeeded": 4} and st["ended"] == 4 and st["percent"] == 100
        assert st["eta_s"] == 0 and st["failures"] == [] and st["usage"]["run_seconds"] > 0
        results = await all_results(agent, grid["sweep_id"], limit=3)
        # The product in key order as given: the first key varies slowest.
        assert [r["override"] for r in results] == [
            {"result": {"k": 1}, "artifact_names": ["a.txt"]}, {"result": {"k": 1}, "artifact_names": ["b.txt"]},
            {"result": {"k": 2}, "artifact_names": ["a.txt"]}, {"result": {"k": 2}, "artifact_names": ["b.txt"]}]
        assert [r["shard"] for r in results] == [0, 1, 2, 3]
        for r in results:
            assert r["state"] == "succeeded" and r["result"]["k"] == r["override"]["result"]["k"]
            assert [a["name"] for a in r["artifacts"]] == r["override"]["artifact_names"]
            assert r["artifacts"][0]["download_url"]
        # Each shard is a task of its own: its status, its tags, and list_tasks(sweep=...).
        one = await agent.call("get_task_status", task_id=results[1]["task_id"])
        assert one["state"] == "succeeded" and one["tags"] == ["scan"]
        page = await agent.call("list_tasks", sweep=grid["sweep_id"], limit=200)
        assert sorted(t["task_id"] for t in page["tasks"]) == sorted(r["task_id"] for r in results)

        done = await finished(agent, listed["sweep_id"])
        assert done["counts"] == {"succeeded": 3}
        assert [r["result"]["i"] for r in await all_results(agent, listed["sweep_id"], limit=2)] == [0, 1, 2]
        assert len((await agent.call("list_tasks", limit=200))["tasks"]) == 7

        # The same key again: the same sweep, nothing more written; other inputs with it: refused.
        first = await sweep(agent, {"list": [{"sleep_s": 0}]}, idempotency_key="k1")
        again = await sweep(agent, {"list": [{"sleep_s": 0}]}, idempotency_key="k1")
        assert again["sweep_id"] == first["sweep_id"] and again["deduplicated"] is True
        assert tasks_on_file(cp) == 8
        other = await agent.error("submit_sweep", tool_name="exercise", vary={"list": [{"sleep_s": 1}]},
                                  idempotency_key="k1")
        assert other["code"] == "INVALID_REQUEST" and first["sweep_id"] in other["message"]
        await finished(agent, first["sweep_id"])


# 200 shards took 37 s on SQLite and 48 s on PostgreSQL on a loaded 2-core machine: PostgreSQL
# runs 100 (the engine changes nothing a shard does; the paging and counting are the same queries).
BIG = {"sqlite": 200, "postgres": 100}


async def test_a_200_shard_sweep_over_http_runs_to_the_end_with_every_shards_result(home: Path, engine: str) -> None:
    """Each shard is a real `exercise` job (sleep_s 0) on the local provider, 8 at a time."""
    big = BIG[engine]
    write_catalog(home, concurrency=8)
    cp = ControlPlane(Settings(home=home, **FAST))
    async with serving(cp) as server, Client(server.url) as client:
        agent = Agent(client)
        started = time.monotonic()
        s = await sweep(agent, {"list": [{"result": {"i": i}} for i in range(big)]}, base_inputs={"sleep_s": 0})
        assert s["shards"] == big
        st = await finished(agent, s["sweep_id"], timeout=600)
        took = time.monotonic() - started
        assert st["counts"] == {"succeeded": big} and st["ended"] == big and st["percent"] == 100, st
        results = await all_results(agent, s["sweep_id"], limit=50)
    print(f"{big} shards ran in {took:.1f} s")
    assert [r["shard"] for r in results] == list(range(big))
    assert [r["result"]["i"] for r in results] == list(range(big))
    assert all(r["state"] == "succeeded" and r["override"] == {"result": {"i": r["shard"]}} for r in results)
    assert len({r["task_id"] for r in results}) == big  # one task a shard, none doubled
    assert len(shards(cp, s["sweep_id"])) == big and tasks_on_file(cp) == big


async def test_one_invalid_shard_refuses_the_whole_sweep(home: Path) -> None:
    async with agent_on(home, sweep_max_shards=6) as (agent, cp):
        vary = {"list": [{"sleep_s": 0}, {"sleep_s": 0.1}, {"sleep_s": -1}, {"sleep_s": "x"}]}
        err = await agent.error("submit_sweep", tool_name="exercise", vary=vary)
        assert err["code"] == "INVALID_REQUEST" and err["shard"] == 2 and err["field"] == "inputs.sleep_s"
        assert err["message"].startswith("shard 2: inputs.sleep_s:")
        grid = await agent.error("submit_sweep", tool_name="exercise", base_inputs={"sleep_s": 0},
                                 vary={"grid": {"exit_code": [0, 1], "progress_steps": [1, -5]}})
        assert grid["shard"] == 1 and grid["field"] == "inputs.progress_steps"
        # Over the server's limit of shards: SWEEP_TOO_LARGE, counted before any is made.
        big = await agent.error("submit_sweep", tool_name="exercise",
                                vary={"grid": {"exit_code": list(range(100)), "sleep_s": list(range(100))}})
        assert big["code"] == "SWEEP_TOO_LARGE" and big["shards"] == 10_000 and big["max"] == 6
        malformed = await agent.error("submit_sweep", tool_name="exercise", vary={"list": [], "grid": {"a": [1]}})
        assert malformed["code"] == "INVALID_REQUEST"
        assert tasks_on_file(cp) == 0 and (await agent.call("list_tasks"))["tasks"] == []


async def test_admission_counts_the_whole_sweep_or_writes_nothing(home: Path) -> None:
    write_catalog(home, queue_length=3)
    async with agent_on(home, limit_tasks_in_flight=5) as (agent, cp):
        full = await agent.error("submit_sweep", tool_name="exercise", vary={"list": [{}] * 4})
        assert full["code"] == "QUEUE_OVERLOADED"
        assert tasks_on_file(cp) == 0
        ok = await sweep(agent, {"list": [{"sleep_s": 30}] * 3})
        assert tasks_on_file(cp) == 3
        # Five in flight at most: three are, so a sweep of three more is refused whole.
        over = await agent.error("submit_sweep", tool_name="exercise", vary={"list": [{}] * 3})
        assert over["code"] == "LIMIT_EXCEEDED" and over["limit"] == "tasks_in_flight"
        assert tasks_on_file(cp) == 3
        await agent.call("cancel_sweep", sweep_id=ok["sweep_id"])
        await finished(agent, ok["sweep_id"])


async def test_max_parallel_holds_and_leaves_the_queue_to_others(home: Path) -> None:
    async with agent_on(home) as (agent, cp):
        s = await sweep(agent, {"list": [{"sleep_s": 0.4}] * 5}, max_parallel=1)
        await anyio.sleep(0.3)
        alone = await agent.submit(inputs={"sleep_s": 0.1})  # behind four queued shards
        seen = 0
        deadline = time.monotonic() + 90
        while not (st := await agent.call("get_sweep_status", sweep_id=s["sweep_id"]))["done"]:
            busy = sum(st["counts"].get(k, 0) for k in ("scheduled", "running"))
            assert busy <= 1, st
            seen = max(seen, busy)
            assert time.monotonic() < deadline
            await anyio.sleep(0.05)
        assert seen == 1 and st["counts"] == {"succeeded": 5}
        rows = shards(cp, s["sweep_id"])
        spans = sorted((r.scheduled_at or 0, r.completed_at or 0) for r in rows)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
        other = cp.store.tasks.get(alone)
        assert other is not None and other.state == "succeeded"
        assert (other.scheduled_at or 0) < max(r.scheduled_at or 0 for r in rows)  # it did not wait behind them


async def test_fail_fast_cancels_the_shards_not_yet_ended(home: Path) -> None:
    async with agent_on(home) as (agent, cp):
        vary = {"list": [{"exit_code": 3}, {"exit_code": 4}, *([{"sleep_s": 0.1}] * 4)]}
        s = await sweep(agent, vary, max_parallel=1, fail_fast=2)
        st = await finished(agent, s["sweep_id"])
        assert st["counts"] == {"failed": 2, "cancelled": 4}
        assert "failure policy" in st["stop_reason"] and st["stopped_at"]
        assert [(f["shard"], f["error"]["code"]) for f in st["failures"]] == [(0, "TOOL_FAILED"), (1, "TOOL_FAILED")]
        results = await all_results(agent, s["sweep_id"], limit=10)
        for r in results[2:]:
            assert r["state"] == "cancelled" and r["error"]["code"] == "CANCELLED"
            assert s["sweep_id"] in r["error"]["message"] and "failure policy" in r["error"]["message"]
        assert all(r.started_at is None for r in shards(cp, s["sweep_id"])[2:])  # never ran

        # Two shards failing at once (both slots): the first end stops the sweep, the other counts.
        both = await sweep(agent, {"list": [{"exit_code": 5}] * 6}, fail_fast=1)
        st = await finished(agent, both["sweep_id"])
        assert 1 <= st["counts"].get("failed", 0) <= 2 and sum(st["counts"].values()) == 6
        assert st["counts"]["failed"] + st["counts"].get("cancelled", 0) == 6 and st["stopped_at"]

        # Without fail_fast every shard runs, the failures counted.
        runs = await sweep(agent, {"list": [{"exit_code": 1}, {}, {"exit_code": 2}]})
        st = await finished(agent, runs["sweep_id"])
        assert st["counts"] == {"failed": 2, "succeeded": 1} and st["stop_reason"] is None
        # A sweep that has ended is not stopped by a cancel: nothing is left to stop.
        late = await agent.call("cancel_sweep", sweep_id=runs["sweep_id"])
        assert late["acknowledged"] is False
        assert (await agent.call("get_sweep_status", sweep_id=runs["sweep_id"]))["stopped_at"] is None


async def test_cancel_sweep_ends_queued_and_running_shards(home: Path) -> None:
    async with agent_on(home) as (agent, cp):
        s = await sweep(agent, {"list": [{"sleep_s": 60, "progress_steps": 60}] * 5})
        deadline = time.monotonic() + 60
        while True:  # two running (the queue's two slots), and reporting progress
            st = await agent.call("get_sweep_status", sweep_id=s["sweep_id"])
            if st["counts"].get("running", 0) == 2 and st["percent"] > 0:
                break
            assert time.monotonic() < deadline, st
            await anyio.sleep(0.1)
        assert st["percent"] < 100 and st["eta_s"] > 0 and st["counts"]["queued"] == 3
        got = await agent.call("cancel_sweep", sweep_id=s["sweep_id"], reason="enough")
        assert got == {"sweep_id": s["sweep_id"], "acknowledged": True, "cancelled": 5}
        st = await finished(agent, s["sweep_id"], timeout=60)
        assert st["counts"] == {"cancelled": 5} and "enough" in st["stop_reason"]
        again = await agent.call("cancel_sweep", sweep_id=s["sweep_id"])
        assert again["acknowledged"] is False and again["cancelled"] == 0
        assert all(r.state == "cancelled" for r in shards(cp, s["sweep_id"]))


@pytest.fixture
def server(server_process: ServerProcess, home: Path) -> ServerProcess:
    server_process.env = fast_env(home, auth_tokens=TOKENS)
    return server_process.start()


async def test_another_callers_sweep_is_not_found_and_a_restart_loses_nothing(server: ServerProcess) -> None:
    async with Client(server.url, auth="tok-alice") as a, Client(server.url, auth="tok-bob") as b:
        alice, bob = Agent(a), Agent(b)
        s = await sweep(alice, {"list": [{"sleep_s": 0.5, "result": {"i": i}} for i in range(4)]}, max_parallel=1)
        sid = s["sweep_id"]
        unknown = "swp_" + "2" * 26
        for tool, args in (("get_sweep_status", {}), ("get_sweep_result", {}), ("cancel_sweep", {})):
            theirs = await bob.error(tool, sweep_id=sid, **args)
            missing = await bob.error(tool, sweep_id=unknown, **args)
            assert theirs == missing == {"code": "NOT_FOUND", "message": "sweep not found"}
        assert await bob.error("list_tasks", sweep=sid) == {"code": "NOT_FOUND", "message": "sweep not found"}
        deadline = time.monotonic() + 60
        while (await alice.call("get_sweep_status", sweep_id=sid))["counts"].get("succeeded", 0) < 1:
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
    server.kill()  # mid-sweep: one shard done, one running or about to, the rest queued
    server.start()
    async with Client(server.url, auth="tok-alice") as a:
        alice = Agent(a)
        st = await finished(alice, sid)
        assert st["counts"] == {"succeeded": 4}
        results = await all_results(alice, sid, limit=3)
        assert [r["result"]["i"] for r in results] == [0, 1, 2, 3]
        page = await alice.call("list_tasks", sweep=sid)
        assert len(page["tasks"]) == 4 and {t["attempt"] for t in page["tasks"]} == {1}
