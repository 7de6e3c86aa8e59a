"""A sweep on the dashboard, over HTTP against a running server: the task list shows it as one
row on one page (its tool, shards by state, progress, cost so far) linking to its page, which pages its shards
in shard order, each linking to its task page; another caller's sweep is not found there."""

from __future__ import annotations

import re
import time
from pathlib import Path

import anyio
import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving
from tests.test_operator_view import base, sign_in

pytestmark = pytest.mark.anyio


async def test_a_sweep_is_one_row_that_opens_onto_its_shards(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, auth_tokens="tok-alice=alice,tok-bob=bob", **FAST))
    async with serving(cp) as server:
        root = base(server.url)
        async with Client(server.url, auth="tok-alice") as mcp:
            alice = Agent(mcp)
            alone = await alice.submit("exercise", inputs={})
            s = await alice.call("submit_sweep", tool_name="exercise",
                                 vary={"list": [{"result": {"i": i}} for i in range(60)]})
            sid = s["sweep_id"]
            deadline = time.monotonic() + 90
            while not (await alice.call("get_sweep_status", sweep_id=sid))["done"]:
                assert time.monotonic() < deadline
                await anyio.sleep(0.2)
            shard_ids = [t["task_id"] for t in (await alice.call("list_tasks", sweep=sid, limit=100))["tasks"]]

        async with httpx.AsyncClient() as http:
            assert (await sign_in(http, root, "tok-alice")).status_code == 303
            page = await http.get(f"{root}/dashboard", params={"limit": 50})
            assert page.status_code == 200
            assert not any(t in page.text for t in shard_ids)  # no row of its own for any shard
            [row] = re.findall(rf'<tr data-sweep="{sid}".*?</tr>', page.text, re.S)
            assert f'href="/dashboard/sweeps/{sid}"' in row and ">exercise<" in row and ">succeeded<" in row
            assert 'value="100.0"' in row and "60/60 0 run 0 failed" in row and "60 succeeded" in row
            assert re.search(r"\d+\.\d{6} USD so far", row), row
            assert (await http.get(f"{root}/dashboard", params={"rows": 1})).text.count(f'data-sweep="{sid}"') == 1
            # The sweep takes one row on one page, whatever the page size: its 60 shards (more than
            # a page) push nothing older to another page, and no page shows the sweep again.
            assert alone in page.text and 'id="next-page"' not in page.text
            # A list of a state lists the shards in it, each a task of its own.
            done = await http.get(f"{root}/dashboard", params={"state": "succeeded"})
            assert f'data-sweep="{sid}"' not in done.text and sum(t in done.text for t in shard_ids) == 50

            first = await http.get(f"{root}/dashboard/sweeps/{sid}")
            assert first.status_code == 200 and "60 succeeded" in first.text
            shards = re.findall(r'<tr data-shard="(\d+)".*?href="/dashboard/tasks/(tsk_\w+)"', first.text, re.S)
            assert [int(i) for i, _ in shards] == list(range(50))
            nxt = re.search(r'id="next-page" href="\?cursor=([^"]+)"', first.text)
            assert nxt is not None
            second = await http.get(f"{root}/dashboard/sweeps/{sid}", params={"cursor": nxt.group(1)})
            more = re.findall(r'<tr data-shard="(\d+)".*?href="/dashboard/tasks/(tsk_\w+)"', second.text, re.S)
            assert [int(i) for i, _ in more] == list(range(50, 60)) and 'id="next-page"' not in second.text
            assert {t for _, t in shards + more} == set(shard_ids)
            one = await http.get(f"{root}/dashboard/tasks/{shards[3][1]}")
            assert one.status_code == 200 and shards[3][1] in one.text and "succeeded" in one.text

        async with httpx.AsyncClient() as bob:
            assert (await sign_in(bob, root, "tok-bob")).status_code == 303
            theirs = await bob.get(f"{root}/dashboard/sweeps/{sid}")
            unknown = await bob.get(f"{root}/dashboard/sweeps/swp_{'2' * 26}")
            assert theirs.status_code == unknown.status_code == 404 and sid not in theirs.text
