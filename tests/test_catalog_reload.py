"""An edited catalog file is taken by a running server without a restart, whole or not at all.

A real `controlplane serve` (HTTP, in a subprocess) and real clients of both protocol eras: the
2025-11-25 one (fastmcp's client in legacy mode) hears `notifications/tools/list_changed`, the
2026-07-28 one (the `mcp` SDK) hears it on its `subscriptions/listen` stream. The new tool is
listed and runs; tasks of a tool the edit removed, running or still queued, run to their end
with the tool they were admitted with. A broken file keeps the catalog as it was, and every one
of its problems is in the server's log and on the dashboard.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from mcp.client.streamable_http import streamable_http_client

from tests.cloud import stop
from tests.conftest import ROOT, Agent, ToolCallError, catalog_text, fast_env, reap_jobs

pytestmark = pytest.mark.anyio

BROKEN_TOOL = """
[tools.broken]
description = "two problems, and a third in the class it names"
resource_class = "cpu_small"
command = ["{python}", "-m", "nothing"]
colour = "red"
max_runtime_s = "long"
input_schema = { type = "object" }
"""


class ListChanges(MessageHandler):
    def __init__(self) -> None:
        self.tools = 0
        self.prompts = 0

    async def on_tool_list_changed(self, message: mcp_types.ToolListChangedNotification) -> None:
        self.tools += 1

    async def on_prompt_list_changed(self, message: mcp_types.PromptListChangedNotification) -> None:
        self.prompts += 1


def replace_file(path: Path, text: str) -> None:
    """As a deployment tool writes it: a new file renamed over the old one."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def serve(home: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = fast_env(home, catalog_reload_s=0.2)
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"serving MCP at (\S+)", log.read_text())
        if m:
            return proc, m.group(1)
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    stop(proc)
    raise AssertionError(f"the server did not start: {log.read_text()}")


async def eventually(check: Any, timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.05)


async def test_an_edited_catalog_is_taken_whole_and_a_broken_one_refused(home: Path, tmp_path: Path) -> None:
    home.mkdir(parents=True)
    catalog = home / "catalog.toml"
    original = catalog_text(concurrency=1)  # one slot: a second task waits in the queue
    catalog.write_text(original)
    log = tmp_path / "server.log"
    proc, url = serve(home, log)
    try:
        heard = ListChanges()
        http = httpx2.AsyncClient()
        async with Client(url, mode="legacy", message_handler=heard) as legacy, http, \
                mcp.Client(streamable_http_client(url, http_client=http)) as modern:
            agent = Agent(legacy)
            assert legacy.initialize_result.capabilities.tools.list_changed is True
            assert {"lj_relax", "exercise"} <= {t.name for t in await legacy.list_tools()}
            assert {p.name for p in await legacy.list_prompts()} == {"lj_relax", "exercise"}
            running = (await agent.call("exercise", sleep_s=3, progress_steps=3, log_lines=2))["task_id"]
            queued = (await agent.call("exercise", sleep_s=0.2, log_lines=2))["task_id"]
            await agent.wait(running, {"running"})
            assert (await agent.call("get_task_status", task_id=queued))["state"] == "queued"

            async with modern.listen(tools_list_changed=True, prompts_list_changed=True) as sub:
                # The edit: exercise is renamed exercise_v2 (removed, and a new tool).
                replace_file(catalog, original.replace("[tools.exercise]", "[tools.exercise_v2]")
                             .replace("[tools.exercise.", "[tools.exercise_v2."))
                with anyio.fail_after(15):
                    event = await sub.__anext__()
                assert type(event).__name__ in ("ToolsListChanged", "PromptsListChanged")
            await eventually(lambda: heard.tools >= 1 and heard.prompts >= 1)

            listed = {t.name for t in await legacy.list_tools()}
            assert "exercise_v2" in listed and "exercise" not in listed and "lj_relax" in listed
            assert "exercise_v2" in {t.name for t in (await modern.list_tools()).tools}
            assert {p.name for p in await legacy.list_prompts()} == {"lj_relax", "exercise_v2"}
            fresh = (await agent.call("exercise_v2", sleep_s=0.1, log_lines=1))["task_id"]
            with pytest.raises(ToolCallError) as gone:
                await agent.call("exercise", sleep_s=0.1)
            assert gone.value.code == "INVALID_REQUEST"

            # The removed tool's tasks end as they began, and everything about them still answers.
            for task_id in (running, queued, fresh):
                assert (await agent.wait(task_id, timeout=60))["state"] == "succeeded", task_id
            for task_id in (running, queued):
                assert (await agent.call("get_task_status", task_id=task_id))["tool_name"] == "exercise"
                assert (await agent.call("get_task_result", task_id=task_id))["state"] == "succeeded"
                assert [ln for ln in await agent.all_logs(task_id) if "line" in ln["message"]]

            # A broken file: the catalog stays revision 2, and the log and the dashboard say why.
            replace_file(catalog, original.replace("max_concurrency = 1", "max_concurrency = 0", 1) + BROKEN_TOOL)
            problems = [f"{catalog}: resource_classes.cpu_small.max_concurrency: ",
                        f"{catalog}: tools.broken.colour: unknown field", f"{catalog}: tools.broken.max_runtime_s: "]
            await eventually(lambda: "keeps revision 2" in log.read_text())
            said = log.read_text()
            assert all(p in said for p in problems), said
            assert "Traceback" not in said
            async with httpx.AsyncClient() as web:
                page = (await web.get(url.removesuffix("/mcp") + "/dashboard", headers={"accept": "text/html"})).text
            assert 'id="catalog-refused"' in page and "the server keeps revision 2" in " ".join(page.split())
            for p in problems:
                assert p.split(": ", 1)[1] in page, p
            listed_after = {t.name for t in await legacy.list_tools()}
            assert listed_after == listed
            assert "broken" not in listed_after
            again = (await agent.call("exercise_v2", sleep_s=0.1))["task_id"]
            assert (await agent.wait(again, timeout=60))["state"] == "succeeded"
    finally:
        stop(proc)
        reap_jobs(home)
