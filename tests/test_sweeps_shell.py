"""A sweep from a shell, through the real `controlplane` command against a running server:
`tasks watch` shows it as one row with one bar (shards ended of all, running, failed) instead of
a row per shard; `sweeps show` counts it; `sweeps cancel` stops what is left."""

from __future__ import annotations

import json
import re

import anyio
import pytest
from fastmcp import Client

from tests.conftest import Agent, ServerProcess
from tests.test_cli import controlplane, ok, user_env

pytestmark = pytest.mark.anyio


@pytest.fixture
def server(server_process: ServerProcess) -> ServerProcess:
    return server_process.start()


async def test_watch_shows_a_sweep_as_one_bar_and_sweeps_show_and_cancel_it(server: ServerProcess) -> None:
    assert server.url is not None
    async with Client(server.url) as client:
        agent = Agent(client)
        alone = await agent.submit("exercise", inputs={})
        done = await agent.call("submit_sweep", tool_name="exercise", vary={"grid": {"result": [{"i": i} for i in range(6)]}})
        slow = await agent.call("submit_sweep", tool_name="exercise", max_parallel=1,
                                vary={"list": [{"sleep_s": 60}] * 5})
        sid = done["sweep_id"]
        for _ in range(600):
            if (await agent.call("get_sweep_status", sweep_id=sid))["done"]:
                break
            await anyio.sleep(0.1)
        await agent.wait(alone)

        shown = ok(controlplane("sweeps", "show", sid, "--url", server.url))
        assert shown.splitlines()[0] == f"{sid} exercise: 6/6 ended, 0 running, 0 failed (100.0%)"
        assert json.loads(ok(controlplane("sweeps", "show", sid, "--url", server.url, "--json")))["counts"] == \
            {"succeeded": 6}

        cancelled = json.loads(ok(controlplane("sweeps", "cancel", slow["sweep_id"], "--url", server.url, "--json")))
        assert cancelled["acknowledged"] is True and cancelled["cancelled"] == 5
        again = json.loads(ok(controlplane("sweeps", "cancel", slow["sweep_id"], "--url", server.url, "--json")))
        assert again["cancelled"] == 0

        watched = ok(controlplane("tasks", "watch", "--until-done", "--url", server.url,
                                  env=user_env(COLUMNS="120")))
        frame = watched  # (the last frame's lines are the last of each id)
        ids = re.findall(r"\b(tsk_[a-z2-7]{26}|swp_[a-z2-7]{26})\b", frame)
        assert sorted(set(ids)) == sorted({alone, sid, slow["sweep_id"]}), frame  # no shard has a row
        line = [li for li in frame.splitlines() if sid in li][-1]
        assert re.search(r"succeeded.*100\.0\s+6/6 0 run 0 failed", line), line
        line = [li for li in frame.splitlines() if slow["sweep_id"] in li][-1]
        assert re.search(r"cancelled.*\s5/5 0 run 0 failed", line), line

    bad = controlplane("sweeps", "show", "swp_" + "2" * 26, "--url", server.url)
    assert bad.returncode == 1 and "NOT_FOUND" in bad.stderr and "sweep not found" in bad.stderr
