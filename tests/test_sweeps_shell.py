"""A sweep from a shell, through the real `controlplane` command against a running server:
`tasks watch` shows it as one row with one bar (shards ended of all, running, failed) instead of
a row per shard; `sweeps show` counts it; `sweeps cancel` stops what is left; `sweeps submit` and
`sweeps result` submit one and read its shards back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

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


def test_sweeps_submit_and_result_from_a_shell(server: ServerProcess, tmp_path: Path) -> None:
    """`sweeps submit` takes its vary from a file (or stdin) and `sweeps result --all` pages back
    every shard's override and result in shard order; bad JSON exits 2, an invalid shard 1."""
    assert server.url is not None
    url = ["--url", server.url]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"grid": {"result": [{"i": i} for i in range(5)], "log_lines": [0, 1]}}))
    submitted = ok(controlplane("sweeps", "submit", "exercise", "--vary", f"@{grid}", "--base", '{"sleep_s": 0}',
                                "--tag", "cli-sweep", "--max-parallel", "3", "--json", *url))
    sid = json.loads(submitted)["sweep_id"]
    assert json.loads(submitted)["shards"] == 10
    again = ok(controlplane("sweeps", "submit", "exercise", "--vary", '{"list": [{}, {}]}', *url))
    assert re.match(r"swp_[a-z2-7]{26} exercise: 2 shards$", again.splitlines()[0])
    piped = subprocess.run([sys.executable, "-m", "controlplane.cli", "sweeps", "submit", "exercise", "--vary", "@-",
                            "--json", *url], input=json.dumps({"list": [{"result": {"n": 7}}]}), env=user_env(),
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["shards"] == 1

    for _ in range(600):
        if json.loads(ok(controlplane("sweeps", "show", sid, "--json", *url)))["done"]:
            break
        time.sleep(0.2)
    answer = json.loads(ok(controlplane("sweeps", "result", sid, "--all", "--limit", "3", "--json", *url)))
    assert answer["next_cursor"] is None and answer["shards"] == 10
    assert [r["shard"] for r in answer["results"]] == list(range(10))
    # the grid's first key varies slowest
    assert [r["override"] for r in answer["results"]][:3] == [{"result": {"i": 0}, "log_lines": 0},
                                                              {"result": {"i": 0}, "log_lines": 1},
                                                              {"result": {"i": 1}, "log_lines": 0}]
    assert all(r["state"] == "succeeded" and r["result"]["i"] == r["override"]["result"]["i"] and
               r["result"]["lines"] == r["override"]["log_lines"] for r in answer["results"])

    page = controlplane("sweeps", "result", sid, "--limit", "4", *url)
    lines = ok(page).splitlines()
    assert len(lines) == 4 and lines[0].split("\t")[:3] == ["0", answer["results"][0]["task_id"], "succeeded"]
    assert json.loads(lines[3].split("\t")[4])["i"] == 1 and "more: --cursor " in page.stderr

    bad = controlplane("sweeps", "submit", "exercise", "--vary", "[1, 2]", *url)
    assert bad.returncode == 2 and "--vary must be a JSON object" in bad.stderr
    missing = controlplane("sweeps", "submit", "exercise", "--vary", f"@{tmp_path / 'none.json'}", *url)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    invalid = controlplane("sweeps", "submit", "exercise", "--vary", '{"list": [{}, {"sleep_s": "long"}]}', *url)
    assert invalid.returncode == 1 and "INVALID_REQUEST" in invalid.stderr and "shard 1" in invalid.stderr
