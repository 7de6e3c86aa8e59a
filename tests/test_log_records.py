"""The server's log records as an operator reads them: `controlplane serve` over HTTP with
CONTROLPLANE_LOG_FORMAT=json writes one JSON object a line on stderr, and the lines of a task's
launch, claim and end carry its task id and attempt as fields, so that filtering one task's id gives
its story and nothing of another's. By default the lines stay text, as people read them. Both engines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from fastmcp import Client

from tests.cloud import stop
from tests.conftest import ROOT, TERMINAL, fast_env, reap_jobs

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def serve(home: Path, **settings: Any) -> tuple[subprocess.Popen[bytes], Path, str]:
    """`controlplane serve` over HTTP on 127.0.0.1, its stderr in a file; (process, file, MCP URL)."""
    home.mkdir(parents=True, exist_ok=True)
    err = home.parent / "serve.stderr"
    with err.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http",
                                 "--port", "0"], env=fast_env(home, **settings), stdout=subprocess.DEVNULL,
                                stderr=sink, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP at (http://[\w.:\[\]]+/mcp)", err.read_text())
        if found:
            return proc, err, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise AssertionError(f"the server did not start: {err.read_text()[-2000:]}")


async def run_tasks(url: str, n: int) -> list[str]:
    """Submit `n` exercise tasks over MCP and wait until each has ended; their ids."""
    async with Client(url) as client:
        ids = [(await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {"log_lines": 2}}))
               .structured_content["task_id"] for _ in range(n)]
        for task_id in ids:
            for _ in range(300):
                status = (await client.call_tool("get_task_status", {"task_id": task_id})).structured_content
                if status["state"] in TERMINAL:
                    break
                await anyio.sleep(0.1)
            assert status["state"] == "succeeded", status
    return ids


def served(home: Path, n: int, **settings: Any) -> tuple[list[str], list[str]]:
    """The ids of `n` tasks run through a real server, and every line it wrote on stderr."""
    proc, err, url = serve(home, **settings)
    try:
        ids = anyio.run(run_tasks, url, n)
        time.sleep(0.5)  # the last end's line is written before its status answers; the reconciler's after
    finally:
        stop(proc)
        reap_jobs(home)
    return ids, err.read_text().splitlines()


def test_json_records_tell_each_task_s_story_apart(home: Path) -> None:
    (first, second), lines = served(home, 2, log_format="json")
    records = [json.loads(line) for line in lines if line.strip()]  # every line is a JSON object
    assert records and all(isinstance(r, dict) and {"time", "level", "logger", "message"} <= r.keys()
                           for r in records)
    [leader] = {r["replica"] for r in records if "replica" in r}  # one replica wrote them all, and says so
    assert all(r.get("replica") == leader for r in records if r.get("action") != "announce")

    for mine, other in ((first, second), (first, second)[::-1]):
        story = [r for r in records if r.get("task_id") == mine]
        actions = [r["action"] for r in story]
        assert actions.index("launch") < actions.index("claim") < actions.index("end"), actions
        assert all(r["attempt"] == 1 for r in story)
        by_action = {r["action"]: r for r in story}
        assert by_action["launch"]["provider"] == by_action["end"]["provider"] == "local"
        assert by_action["launch"]["job_name"] == by_action["end"]["job_name"]
        assert by_action["end"]["state"] == "succeeded"
        assert not any(other in json.dumps(r) for r in story)  # nothing of the other task's


def test_text_lines_by_default(home: Path) -> None:
    [task_id], lines = served(home, 1)
    [announced] = [line for line in lines if line.startswith("serving MCP at http://127.0.0.1:")]
    records = [line for line in lines if line.strip() and line != announced]
    assert records and all(TEXT_LINE.match(line) for line in records), records
    assert not any(line.lstrip().startswith("{") for line in lines)
    assert any(task_id in line and "ended: succeeded" in line for line in records)  # the message says it


def test_json_records_over_stdio(home: Path, tmp_path: Path) -> None:
    """Over stdio stdout is the protocol's; stderr carries the records, JSON too."""
    from fastmcp.client.transports import StdioTransport

    err = tmp_path / "stdio.stderr"

    async def run() -> str:
        with err.open("w") as sink:
            transport = StdioTransport(command=sys.executable, args=["-m", "controlplane.cli", "serve", "--transport",
                                       "stdio"], env=fast_env(home, log_format="json", log_level="INFO"),
                                       cwd=str(ROOT), log_file=sink)
            async with Client(transport) as client:
                task_id = (await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})
                           ).structured_content["task_id"]
                for _ in range(300):
                    status = (await client.call_tool("get_task_status", {"task_id": task_id})).structured_content
                    if status["state"] in TERMINAL:
                        return str(task_id)
                    await anyio.sleep(0.1)
        raise AssertionError(f"{task_id} did not end")

    try:
        task_id = anyio.run(run)
    finally:
        reap_jobs(home)
    records = [json.loads(line) for line in err.read_text().splitlines() if line.strip()]
    assert [r["action"] for r in records if r.get("task_id") == task_id] == ["launch", "claim", "end"]


def _garbage_request(url: str) -> None:
    """Bytes that are not HTTP, on the server's socket: uvicorn itself logs a warning."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        try:
            s.recv(1024)
        except OSError:
            pass


def test_the_web_server_s_own_lines_are_json_too(home: Path) -> None:
    """uvicorn's warnings (here: a request that is not HTTP) come out in the server's format."""
    for log_format in ("json", "text"):
        proc, err, url = serve(home / log_format, log_format=log_format)
        try:
            _garbage_request(url)
            time.sleep(0.5)
        finally:
            stop(proc)
        lines = [line for line in err.read_text().splitlines() if line.strip()]
        if log_format == "json":
            records = [json.loads(line) for line in lines]  # every line, uvicorn's included
            assert any(r["logger"].startswith("uvicorn") and "HTTP" in r["message"] for r in records), records
        else:
            assert any(TEXT_LINE.match(line) and " uvicorn.error: " in line for line in lines), lines
