"""What a new user's first hour trips over, at run time, each as the user meets it: the demo on a
relative home, a runner that dies before it can report, an HTTP body over the limit, the CLI
against a server with tokens, a server's start-up output, and the CLI's tables in 80 columns."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import mcp
import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.conftest import FAST, ROOT, Agent, ServerProcess, fast_env, reap_jobs, serving, write_catalog
from tests.test_cli import Cli, controlplane, ok, user_env

pytestmark = pytest.mark.anyio
RUNNER_DIES = "runner-wrapper: cannot start: ModuleNotFoundError: No module named 'controlplane_runner'"


# ---- a relative home ----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_demo_runs_on_a_relative_home(tmp_path: Path, how: str) -> None:
    """`controlplane demo --home relhome` and `CONTROLPLANE_HOME=relhome controlplane demo`, from a
    working directory of their own: the job runs (its runner starts in its job directory) and the
    state lands in ./relhome."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    args, env = (["--home", "relhome"], user_env()) if how == "flag" else ([], user_env(CONTROLPLANE_HOME="relhome"))
    try:
        done = controlplane("demo", "--n-atoms", "13", "--fmax", "0.01", *args, env=env, cwd=workdir, timeout=300)
        out = ok(done)
        assert "downloaded and verified" in out and "WORKER_LOST" not in out
        assert (workdir / "relhome" / "controlplane.db").exists() and list((workdir / "relhome" / "jobs").iterdir())
    finally:
        reap_jobs(workdir / "relhome")


def test_a_relative_home_is_resolved_once_where_settings_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONTROLPLANE_HOME", "relhome")
    for settings in (Settings(), Settings(home="relhome"), Settings(home=Path("relhome"))):
        assert settings.home == tmp_path / "relhome"
        assert settings.endpoint_file.is_absolute()
        assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'relhome' / 'controlplane.db'}"


# ---- a runner that dies before it reports -------------------------------------------------------
def broken_python(tmp_path: Path, noise_lines: int) -> Path:
    """An interpreter wrapper that prints a lot, then the error, and exits: the runner never starts."""
    script = tmp_path / "broken-python"
    script.write_text("#!/bin/sh\n"
                      f"i=0; while [ $i -lt {noise_lines} ]; do echo \"noise $i\"; i=$((i+1)); done\n"
                      f"echo \"{RUNNER_DIES}\" >&2\nexit 1\n")
    script.chmod(0o755)
    return script


async def test_what_a_runner_printed_before_dying_reaches_the_tasks_logs_and_error(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider's runner dies before it could report (its interpreter cannot start it):
    its last lines are in tail_task_logs and in the task's error, bounded, not only in a file of
    the job's directory."""
    monkeypatch.setenv("CONTROLPLANE_LOCAL_PYTHON", str(broken_python(tmp_path, noise_lines=5000)))
    write_catalog(home)  # exercise: one attempt, no retries
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit("exercise")
        st = await agent.wait(tid)
        assert st["state"] == "failed" and st["error"]["code"] == "WORKER_LOST"
        assert RUNNER_DIES in st["error"]["message"] and len(st["error"]["message"]) < 1000
        result = await agent.call("get_task_result", task_id=tid)
        assert RUNNER_DIES in result["error"]["message"]
        lines = await agent.all_logs(tid)
        assert lines[-1]["message"] == RUNNER_DIES and lines[-1]["stream"] == "stderr"
        assert 1 < len(lines) <= 20  # the console's last lines, not its 5000


# ---- a stdio server's download links ------------------------------------------------------------
async def test_a_stdio_servers_artifacts_can_be_read_after_the_server_exited(home: Path) -> None:
    """A stdio server serves its signed links only while it runs; what its answer gives for an
    artifact in the local store, a file:// URL on this machine, still reads after it exited, and
    matches the artifact's size and sha256."""
    from fastmcp.client.transports import StdioTransport

    transport = StdioTransport(command=sys.executable, args=["-m", "controlplane.cli", "serve"],
                               env=fast_env(home), cwd=str(ROOT), keep_alive=False)
    async with Client(transport) as client:
        agent = Agent(client)
        tid = await agent.submit("exercise", inputs={"artifact_bytes": 100_000})
        assert (await agent.wait(tid))["state"] == "succeeded"
        [art] = (await agent.call("get_task_result", task_id=tid))["artifacts"]
        [listed] = json.loads((await client.read_resource(f"task://{tid}"))[0].text)["result"]["artifacts"]
        assert listed["file_url"] == art["file_url"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server is gone: its links with it
        try:
            httpx.get(art["download_url"], timeout=2)
        except httpx.ConnectError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the stdio server's listener still answers")
    with urllib.request.urlopen(art["file_url"]) as f:
        data = f.read()
    assert len(data) == art["size_bytes"] and hashlib.sha256(data).hexdigest() == art["sha256"]


# ---- an HTTP body over the limit ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 and 2025-11-25
async def test_a_body_over_the_http_limit_is_refused_with_the_code_the_limit_and_the_hint(
        tmp_path: Path, mode: str) -> None:
    """A call whose JSON body is over the transport's limit (4 MiB) is refused the way an
    oversize submit is (INVALID_REQUEST, the limit, pass data by reference), as a JSON-RPC error
    the SDK clients surface; nothing was created, and the session goes on."""
    cp = ControlPlane(Settings(home=tmp_path / "home", **FAST))
    async with serving(cp) as server, Client(server.url, mode=mode) as client:
        big = {"tool_name": "exercise", "inputs": {"result": {"blob": "x" * (5 * 1024 * 1024)}}}
        with pytest.raises(MCPError) as refused:
            await client.call_tool("submit_task", big)
        err = refused.value.error
        assert err.code == -32600 and "4194304" in err.message and "by reference" in err.message
        assert err.data["code"] == "INVALID_REQUEST" and err.data["limit_bytes"] == 4 * 1024 * 1024
        assert "by reference" in err.data["hint"]
        # What a smaller oversize input answers: the same code and hint.
        small = await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {
            "result": {"blob": "x" * (300 * 1024)}}}, raise_on_error=False)
        assert small.is_error and small.structured_content["hint"] == err.data["hint"]
        assert (await client.call_tool("list_tasks", {})).structured_content["tasks"] == []


async def test_the_mcp_sdk_client_surfaces_the_refusal_of_a_body_over_the_limit(tmp_path: Path) -> None:
    cp = ControlPlane(Settings(home=tmp_path / "home", **FAST))
    async with serving(cp) as server, mcp.Client(server.url) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {"blob": "x" * 5_000_000}})
        assert refused.value.error.data["code"] == "INVALID_REQUEST" and "by reference" in str(refused.value)


async def test_a_streamed_body_over_the_limit_is_refused_too(tmp_path: Path) -> None:
    """A body sent in chunks (no Content-Length) is counted as it comes."""
    cp = ControlPlane(Settings(home=tmp_path / "home", **FAST))
    async with serving(cp) as server, httpx.AsyncClient() as http:
        async def chunks() -> Any:
            for _ in range(5):
                yield b" " * (1024 * 1024)

        r = await http.post(server.url, content=chunks(), headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream"})
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["data"]["code"] == "INVALID_REQUEST"


# ---- the CLI against a server with tokens -------------------------------------------------------
def test_tasks_list_without_a_token_says_refused_and_how_to_pass_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home, fast_env(home, auth_tokens="s3cret=alice")).start()
    try:
        assert server.url is not None
        nothing = controlplane("tasks", "list", "--url", server.url)
        assert nothing.returncode == 4 and "cannot reach" not in nothing.stderr
        assert "401" in nothing.stderr and "--token" in nothing.stderr and "CONTROLPLANE_TOKEN" in nothing.stderr
        wrong = controlplane("tasks", "list", "--url", server.url, "--token", "guess")
        assert wrong.returncode == 4 and "401" in wrong.stderr and "refused" in wrong.stderr
        assert "guess" not in wrong.stderr
        right = controlplane("tasks", "list", "--json", env=user_env(CONTROLPLANE_URL=server.url,
                                                                      CONTROLPLANE_TOKEN="s3cret"))
        assert json.loads(ok(right))["tasks"] == []
        for done in (nothing, wrong):
            assert "Traceback" not in done.stderr
    finally:
        server.stop()


# ---- a server's start-up output -----------------------------------------------------------------
def test_an_http_server_starts_without_alembic_info_lines(tmp_path: Path) -> None:
    """The migrations a start applies are not announced line by line (warnings would still show)."""
    home = tmp_path / "home"
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
                            env=fast_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "serving MCP at" in line or len(seen) > 200:
                break
        assert any("serving MCP at" in line for line in seen), "".join(seen)
        assert not [line for line in seen if "alembic" in line], "".join(seen)
        assert (home / "controlplane.db").exists()
    finally:
        proc.terminate()
        proc.wait(15)


# ---- the CLI's tables in 80 columns -------------------------------------------------------------
def test_watch_and_result_print_states_and_links_whole_in_80_columns(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home).start()
    try:
        assert server.url is not None
        cli = Cli(server.url)
        narrow = user_env(COLUMNS="80")
        tid = cli.json("submit", "exercise", "--inputs", '{"artifact_bytes": 1000}')["task_id"]
        cancelled = cli.json("submit", "exercise", "--inputs", '{"sleep_s": 60}')["task_id"]
        cli.wait(tid)
        cli.json("cancel", cancelled)
        cli.wait(cancelled)

        watched = ok(controlplane("tasks", "watch", "--until-done", "--url", server.url, env=narrow))
        rows = {m.group(1): m.group(2) for m in re.finditer(r"(tsk_[a-z2-7]{26})\s+\S+\s+(\S+)", watched)}
        assert rows == {tid: "succeeded", cancelled: "cancelled"}, watched
        assert max(len(line) for line in watched.splitlines()) <= 80

        printed = ok(controlplane("tasks", "result", tid, "--url", server.url, env=narrow))
        [art] = cli.json("result", tid)["artifacts"]
        links = [line.strip() for line in printed.splitlines() if line.strip().startswith("http")]
        assert links and links[0].split("?")[0] == art["download_url"].split("?")[0]
        assert httpx.get(links[0]).content == (home / "objects").joinpath(
            f"tasks/{tid}/attempts/1/artifacts/data.bin").read_bytes()  # copied from the terminal, it works
        assert re.search(r"^state\s+succeeded$", printed, re.M)
        assert "file://" not in printed and "file_url" not in art  # over HTTP: no path of the server's
    finally:
        server.stop()
        reap_jobs(home)
