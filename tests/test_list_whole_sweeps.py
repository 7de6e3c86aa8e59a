"""list_tasks with `whole_sweeps`: a 300-shard sweep submitted among ordinary tasks takes one row
(the sweep's: its id, state, percent and shard counts) in the caller's list and in an
administrator's list of everyone's, on one page; paging with the cursor across it loses and
doubles nothing, at every page size; `sweep=` still lists the shards, `states` folds the shards
in those states; without the option every shard is listed as before. The real `controlplane`
command: `tasks list --whole-sweeps`, and `tasks watch`, whose table keeps the tasks submitted
before the sweep. Over HTTP with OAuth tokens, on both engines."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving, write_catalog
from tests.oidc import FakeIdP
from tests.test_cli import controlplane, ok, user_env

pytestmark = pytest.mark.anyio
OWN = ["tasks:submit", "tasks:read", "tasks:cancel"]
SHARDS = 300
ID = re.compile(r"\b(tsk_[a-z2-7]{26}|swp_[a-z2-7]{26})\b")


@pytest.fixture
async def server(home: Path, idp: FakeIdP) -> AsyncIterator[Any]:
    cp = ControlPlane(Settings(home=home, auth_issuer=idp.issuer, auth_jwks_uri=idp.jwks_uri, **FAST))
    async with serving(cp) as srv:
        yield srv


async def every_page(agent: Agent, limit: int, **args: Any) -> list[dict[str, Any]]:
    """Every row of list_tasks, page by page with the cursor."""
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(400):
        page = await agent.call("list_tasks", limit=limit, **args, **({"cursor": cursor} if cursor else {}))
        assert len(page["tasks"]) <= limit
        rows += page["tasks"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows
    raise AssertionError("list_tasks never ended")


async def test_a_sweep_takes_one_row_and_the_cursor_pages_across_it(server: Any, idp: FakeIdP) -> None:
    def token(sub: str, scopes: list[str]) -> str:
        return idp.token(sub, audience=server.url, scopes=scopes)

    alice_tok = token("alice", OWN)
    async with Client(server.url, auth=token("bob", OWN)) as b, Client(server.url, auth=alice_tok) as a, \
            Client(server.url, auth=token("root", ["tasks:admin"])) as r:
        bob, alice, admin = Agent(b), Agent(a), Agent(r)
        theirs = await bob.submit("exercise", inputs={})
        # Three ordinary tasks, then the sweep, then one more; all but the first wait for it (so
        # nothing but one sleeping task runs).
        first = await alice.submit("exercise", inputs={"sleep_s": 600})
        older = [first, *[await alice.submit("exercise", inputs={}, after=[first]) for _ in range(2)]]
        sid = (await alice.call("submit_sweep", tool_name="exercise", after=[first],
                                vary={"list": [{"result": {"i": i}} for i in range(SHARDS)]}))["sweep_id"]
        newer = await alice.submit("exercise", inputs={}, after=[first])
        mine = [newer, sid, *reversed(older)]  # newest first

        page = await alice.call("list_tasks", whole_sweeps=True, limit=10)
        assert [t["task_id"] for t in page["tasks"]] == mine and page["next_cursor"] is None
        row = page["tasks"][1]
        assert row["sweep_id"] == sid and "sweep" not in row
        assert (row["tool_name"], row["state"], row["shards"], row["counts"]) == \
            ("exercise", "queued", f"0/{SHARDS} 0 run 0 failed", {"waiting": SHARDS})
        assert all("sweep_id" not in t for t in page["tasks"] if t["task_id"] != sid)
        for limit in (1, 2, 3, 4):
            assert [t["task_id"] for t in await every_page(alice, limit, whole_sweeps=True)] == mine, limit

        # Without the option, as before: every shard its own row, naming its sweep.
        page = await alice.call("list_tasks", limit=10)
        assert page["tasks"][0]["task_id"] == newer and all(t["sweep"] == sid for t in page["tasks"][1:])
        every = await every_page(alice, 200)
        assert len(every) == len({t["task_id"] for t in every}) == SHARDS + 4
        # sweep= wins over whole_sweeps: that sweep's shards; states= folds the shards in them.
        shards = await every_page(alice, 200, sweep=sid, whole_sweeps=True)
        assert len({t["task_id"] for t in shards}) == SHARDS and all(t["sweep"] == sid for t in shards)
        waiting = await every_page(alice, 2, whole_sweeps=True, states=["waiting", "queued"])
        assert [t["task_id"] for t in waiting] == [newer, sid, *reversed(older[1:])]
        await alice.wait(first, {"running"})
        running = await every_page(alice, 2, whole_sweeps=True, states=["running", "queued"])
        assert [t["task_id"] for t in running] == [first]

        # An administrator's list of everyone's: the sweep is one row there too, with its owner.
        everyone = [*mine, theirs]
        for limit in (1, 3, 50):
            rows = await every_page(admin, limit, everyone=True, whole_sweeps=True)
            assert [t["task_id"] for t in rows] == everyone, limit
        assert [t["owner"] for t in rows] == [f"{idp.issuer}#alice"] * 5 + [f"{idp.issuer}#bob"]
        assert len(await every_page(admin, 200, everyone=True)) == SHARDS + 5

        # The command line: tasks list --whole-sweeps.
        env = user_env(COLUMNS="120", CONTROLPLANE_TOKEN=alice_tok)
        listed = json.loads(ok(await anyio.to_thread.run_sync(lambda: controlplane(
            "tasks", "list", "--whole-sweeps", "--limit", "3", "--json", "--url", server.url, env=env))))
        assert [t["task_id"] for t in listed["tasks"]] == mine[:3] and listed["next_cursor"]
        table = ok(await anyio.to_thread.run_sync(lambda: controlplane(
            "tasks", "list", "--whole-sweeps", "--url", server.url, env=env)))
        assert ID.findall(table) == mine
        assert re.search(rf"{sid}\s+exercise\s+queued\s.*0/{SHARDS} 0 run 0 failed", table), table

        # tasks watch: its page of 20 holds the tasks older than the sweep (not 20 of its shards).
        await alice.call("cancel_sweep", sweep_id=sid)
        await alice.call("cancel_task", task_id=first, cascade=True)
        for t in mine:
            if t != sid:
                await alice.wait(t)
        frame = ok(await anyio.to_thread.run_sync(lambda: controlplane(
            "tasks", "watch", "--until-done", "--url", server.url, env=env)))
        assert set(ID.findall(frame)) == set(mine), frame
        line = [li for li in frame.splitlines() if sid in li][-1]
        assert re.search(rf"cancelled.*\s{SHARDS}/{SHARDS} 0 run 0 failed", line), line


async def test_the_merged_page_keeps_the_order_across_pages_ties_purged_shards_and_filters(home: Path) -> None:
    """Sweeps and tasks interleaved in time, two sweeps and a task submitted at the same instant,
    a sweep whose lowest shards retention purged: every page size lists each task and each
    sweep once, in submission order (a sweep at its lowest shard on file), also with `tool_name`
    and `states`, and as the walk that passes every shard lists them (a tag filter takes it)."""
    write_catalog(home, queue_length=2000)
    cp = ControlPlane(Settings(home=home, **FAST))
    async with serving(cp) as srv, Client(srv.url) as c:
        agent = Agent(c)
        first = await agent.submit("exercise", inputs={"sleep_s": 600}, tags=["all"])
        order = [first]  # oldest first: task ids, and sweep ids for their shards
        tools = {first: "exercise"}

        async def task(tool: str) -> None:
            tid = await agent.submit(tool, inputs={}, after=[first], tags=["all"])
            order.append(tid)
            tools[tid] = tool

        async def sweep(tool: str, n: int) -> str:
            sid = (await agent.call("submit_sweep", tool_name=tool, after=[first], tags=["all"],
                                    vary={"list": [{} for _ in range(n)]}))["sweep_id"]
            order.append(sid)
            tools[sid] = tool
            return sid

        for i in range(3):
            await task("exercise")
            await sweep("lj_relax" if i == 1 else "exercise", 40)
            await task("lj_relax")
        clock = cp.store.writer.clock
        tied = time.time() + 5  # later than every other, and the same for all three
        cp.store.writer.clock = lambda: tied
        try:
            await sweep("exercise", 30)
            await task("exercise")
            await sweep("lj_relax", 30)
        finally:
            cp.store.writer.clock = clock
        await task("exercise")  # (submitted now: older than the three at the tied instant)
        order.insert(-3, order.pop())

        # Retention takes the five lowest shards of the middle sweep (cancelled, then purged).
        middle = order[5]
        by_shard = [t["task_id"] for t in (await agent.call("get_sweep_result", sweep_id=middle, limit=5))["results"]]
        for tid in by_shard:
            await agent.call("cancel_task", task_id=tid)
        cp.reconciler.retention.sweep(time.time() + 10 * 365 * 86400)
        left = await every_page(agent, 200, sweep=middle)
        assert len(left) == 35 and not {t["task_id"] for t in left} & set(by_shard)

        newest_first = order[::-1]
        for limit in (1, 2, 3, 5, 50):
            assert [t["task_id"] for t in await every_page(agent, limit, whole_sweeps=True)] == newest_first, limit
        walked = await every_page(agent, 3, whole_sweeps=True, tags_any=["all"])  # the shard-by-shard walk
        assert [t["task_id"] for t in walked] == newest_first
        relaxing = [t for t in newest_first if tools[t] == "lj_relax"]
        for limit in (1, 2, 50):
            rows = await every_page(agent, limit, whole_sweeps=True, tool_name="lj_relax")
            assert [t["task_id"] for t in rows] == relaxing, limit
        waiting = await every_page(agent, 2, whole_sweeps=True, states=["waiting", "running"])
        assert [t["task_id"] for t in waiting] == newest_first
        await agent.call("cancel_task", task_id=first, cascade=True)


def test_a_folded_page_costs_the_same_whatever_the_size_of_the_sweeps(tmp_path: Path) -> None:
    """The SQLite machine's steps for a folded page of 20 over 30 tasks and a newer sweep: no more
    with a 3,000-shard sweep than with a 100-shard one (the walk that passes every shard took
    steps in proportion)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from controlplane import api

    def steps(shards: int) -> int:
        home = tmp_path / str(shards)
        write_catalog(home, queue_length=5000)
        cp = ControlPlane(Settings(home=home, **FAST))
        try:
            for _ in range(30):
                cp.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={}))
            cp.service.submit_sweep("alice", api.SubmitSweep.model_validate(
                {"tool_name": "exercise", "base_inputs": {}, "vary": {"list": [{} for _ in range(shards)]}}))
            count = [0]

            def install(conn: Any, *_: Any) -> None:
                conn.connection.driver_connection.set_progress_handler(lambda: count.__setitem__(0, count[0] + 1) or 0, 10)

            event.listen(Engine, "before_cursor_execute", install)
            try:
                rows = cp.store.tasks.list("alice", limit=20, whole_sweeps=True)
            finally:
                event.remove(Engine, "before_cursor_execute", install)
            assert len(rows) == 20 and rows[0].sweep_id is not None and not any(r.sweep_id for r in rows[1:])
            return count[0]
        finally:
            cp.store.db.dispose()

    small, large = steps(100), steps(3000)
    assert large < small * 1.2 + 100, (small, large)
