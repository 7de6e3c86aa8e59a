"""Owner scoping over real HTTP: each bearer token is one caller, and a caller only ever sees its
own tasks. Someone else's task answers exactly like a task that does not exist. Without a token
the server answers 401, and it refuses to listen beyond loopback without tokens at all."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastmcp import Client

from tests.callers import ALICE, TOKENS, alice, bob, token_server  # noqa: F401
from tests.cloud import stop
from tests.conftest import ROOT, Agent, ServerProcess, fast_env

pytestmark = pytest.mark.anyio

UNKNOWN_ID = "tsk_" + "a" * 26


@pytest.fixture
def server(server_process: ServerProcess, home: Path) -> ServerProcess:
    return token_server(server_process, home)


async def raw_error(agent: Agent, tool: str, **args) -> str:
    """The error exactly as it reaches the client: the text of an isError result."""
    res = await agent.client.call_tool(tool, args, raise_on_error=False)
    assert res.is_error, res
    return res.content[0].text


async def test_someone_elses_task_answers_like_an_unknown_one(alice: Agent, bob: Agent) -> None:
    done = await alice.submit(inputs={"log_lines": 3, "artifact_bytes": 1000, "result": {"secret": "alice's"}})
    running = await alice.submit(inputs={"sleep_s": 120, "progress_steps": 120})
    assert (await alice.wait(done))["state"] == "succeeded"
    await alice.wait(running, {"running"})

    for tool in ("get_task_status", "tail_task_logs", "get_task_result", "cancel_task"):
        unknown = await raw_error(bob, tool, task_id=UNKNOWN_ID)
        assert unknown == '{"code":"NOT_FOUND","message":"task not found"}'
        for task_id in (done, running):
            assert await raw_error(bob, tool, task_id=task_id) == unknown, (tool, task_id)

    # Bob's cancel did nothing; Alice still sees and owns both tasks.
    st = await alice.call("get_task_status", task_id=running)
    assert st["state"] == "running" and st["cancel_requested"] is False
    assert (await alice.call("get_task_result", task_id=done))["result"]["secret"] == "alice's"
    assert len((await alice.call("tail_task_logs", task_id=done))["lines"]) == 3

    out = await alice.call("cancel_task", task_id=running)
    assert out["acknowledged"] is True
    assert (await alice.wait(running))["state"] == "cancelled"


async def test_each_caller_lists_only_their_own_tasks(alice: Agent, bob: Agent) -> None:
    a1 = await alice.submit(tags=["shared-tag"])
    a2 = await alice.submit(tags=["shared-tag"])
    b1 = await bob.submit(tags=["shared-tag"])
    for tid in (a1, a2):
        await alice.wait(tid)
    await bob.wait(b1)

    assert [t["task_id"] for t in (await alice.call("list_tasks"))["tasks"]] == [a2, a1]
    assert [t["task_id"] for t in (await bob.call("list_tasks"))["tasks"]] == [b1]
    assert [t["task_id"] for t in (await bob.call("list_tasks", tags_any=["shared-tag"]))["tasks"]] == [b1]
    assert [t["task_id"] for t in (await bob.call("list_tasks", tool_name="exercise",
                                                  states=["succeeded"]))["tasks"]] == [b1]
    # Naming another owner lists nothing (only team members and administrators may: test_teams.py).
    assert (await bob.call("list_tasks", owner="alice")) == {"tasks": [], "next_cursor": None}
    assert (await bob.call("list_tasks", owner="alice", tags_any=["shared-tag"]))["tasks"] == []
    # Paging through Alice's tasks never leaks Bob's either.
    first = await alice.call("list_tasks", limit=1)
    second = await alice.call("list_tasks", limit=1, cursor=first["next_cursor"])
    assert [t["task_id"] for t in first["tasks"] + second["tasks"]] == [a2, a1]
    assert second["next_cursor"] is None


async def test_same_idempotency_key_is_per_caller(alice: Agent, bob: Agent) -> None:
    a = await alice.call("submit_task", tool_name="exercise", idempotency_key="nightly-run")
    b = await bob.call("submit_task", tool_name="exercise", idempotency_key="nightly-run")
    assert a["task_id"] != b["task_id"]
    assert "deduplicated" not in a and "deduplicated" not in b
    again = await alice.call("submit_task", tool_name="exercise", idempotency_key="nightly-run")
    assert again["task_id"] == a["task_id"] and again["deduplicated"] is True
    assert await raw_error(bob, "get_task_status", task_id=a["task_id"]) == \
        '{"code":"NOT_FOUND","message":"task not found"}'
    await alice.wait(a["task_id"])
    await bob.wait(b["task_id"])


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_requests_without_a_valid_token_get_401(server: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        anonymous = await http.post(server.url, json=INITIALIZE, headers=MCP_HEADERS)
        assert anonymous.status_code == 401
        wrong = await http.post(server.url, json=INITIALIZE,
                                headers={**MCP_HEADERS, "authorization": "Bearer tok-mallory"})
        assert wrong.status_code == 401
        right = await http.post(server.url, json=INITIALIZE,
                                headers={**MCP_HEADERS, "authorization": f"Bearer {ALICE}"})
        assert right.status_code == 200
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, it gets no session
        async with Client(server.url) as c:
            await c.list_tools()


def _serve_cmd(host: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--host", host, "--port", "0"]


def test_serve_on_all_interfaces_without_tokens_refuses_to_start(home: Path) -> None:
    done = subprocess.run(_serve_cmd("0.0.0.0"), env=fast_env(home), cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode != 0
    said = " ".join(done.stderr.decode().split())
    assert "refusing to listen on 0.0.0.0 without auth" in said, said
    assert "CONTROLPLANE_AUTH_TOKENS" in said
    assert "Traceback" not in said


def test_an_identity_the_store_cannot_keep_is_refused_at_start(tmp_path: Path) -> None:
    """An identity owns tasks: at most 200 printable characters (the store's owner column)."""
    env = fast_env(tmp_path / "home", auth_tokens="tok-long=" + "x" * 201)
    done = subprocess.run(_serve_cmd("127.0.0.1"), env=env, cwd=ROOT, capture_output=True, timeout=120)
    said = " ".join(done.stderr.decode().split())
    assert done.returncode != 0 and "identity must be at most 200 printable characters" in said, said
    assert "Traceback" not in said


def test_serve_on_all_interfaces_with_tokens_starts(home: Path) -> None:
    proc = subprocess.Popen(_serve_cmd("0.0.0.0"), env=fast_env(home, auth_tokens=TOKENS), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline().decode()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"serving MCP at (\S+)", line)
            url = m.group(1) if m else None
        assert url is not None, "server did not start"
        port = url.rsplit(":", 1)[1].split("/")[0]
        r = httpx.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, headers=MCP_HEADERS, timeout=30)
        assert r.status_code == 401
    finally:
        stop(proc, grace_s=15)
