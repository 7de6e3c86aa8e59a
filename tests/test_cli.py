"""The `controlplane` command line as a user runs it: `db upgrade`, the `tasks` commands against a
running server, and `demo`, the one command that shows the whole path working."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect

from controlplane.store.db import Database
from tests.conftest import ROOT, TERMINAL, ServerProcess, pid_alive

TASK_ID = re.compile(r"tsk_[a-z2-7]{26}")


def user_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any CONTROLPLANE_* setting leaking in from outside, but
    with the test's database (the `engine` fixture's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_") or k == "CONTROLPLANE_DATABASE_URL"}
    env.update(extra)
    return env


def controlplane(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], env=env or user_env(COLUMNS="200"),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


@pytest.fixture
def server(server_process: ServerProcess) -> ServerProcess:
    return server_process.start()


class Cli:
    """`controlplane tasks ...` pointed at one server."""

    def __init__(self, url: str):
        self.url = url

    def run(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return controlplane("tasks", *args, "--url", self.url, **kw)

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(ok(self.run(*args, "--json")))

    def wait(self, task_id: str, states: set[str] = TERMINAL, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.json("show", task_id)
            if st["state"] in states:
                return st
            assert time.monotonic() < deadline, f"{task_id} still {st['state']} after {timeout}s"
            time.sleep(0.3)


@pytest.fixture
def cli(server: ServerProcess) -> Cli:
    assert server.url is not None
    return Cli(server.url)


def test_db_upgrade_creates_the_database_at_the_latest_revision(home: Path, engine: str, empty_db_url: str) -> None:
    if engine == "sqlite":  # no URL set: the default, a file in the home
        env, url = user_env(), f"sqlite:///{home / 'controlplane.db'}"
    else:
        env, url = user_env(CONTROLPLANE_DATABASE_URL=empty_db_url), empty_db_url
    done = controlplane("db", "upgrade", "--home", str(home), env=env)
    ok(done)
    from alembic.script import ScriptDirectory

    from controlplane.store.db import MIGRATIONS_DIR

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert f"database at revision {head}" in done.stderr
    db = Database(url)
    assert db.current_revision() == head
    assert {"tasks", "task_tags", "task_events", "task_logs", "artifacts", "jobs", "leases"} <= set(
        inspect(db.engine).get_table_names())
    db.dispose()
    # Running it again is harmless.
    again = controlplane("db", "upgrade", "--home", str(home), env=env)
    ok(again)
    assert f"database at revision {head}" in again.stderr


def test_a_database_that_cannot_be_opened_is_named_without_its_password(tmp_path: Path) -> None:
    url = "postgresql://cp:s3cret@127.0.0.1:9/nowhere"  # nothing listens on port 9
    for command in (["db", "upgrade"], ["serve", "--transport", "http", "--port", "0"]):
        done = controlplane(*command, "--home", str(tmp_path / "home"), env=user_env(CONTROLPLANE_DATABASE_URL=url))
        said = " ".join(done.stderr.split())
        assert done.returncode == 2, said
        assert "cannot open the database postgresql://cp:***@127.0.0.1:9/nowhere" in said and "refused" in said
        assert "s3cret" not in said and "Traceback" not in said
    done = controlplane("db", "upgrade", "--home", str(tmp_path / "home"),
                        env=user_env(CONTROLPLANE_DATABASE_URL="mysql://a@b/c"))
    assert done.returncode == 2 and "the database URL must be sqlite:///" in done.stderr


def test_submit_show_logs_result(cli: Cli) -> None:
    sub = cli.json("submit", "exercise", "--inputs", '{"log_lines": 3, "result": {"answer": 42}}')
    task_id = sub["task_id"]
    assert TASK_ID.fullmatch(task_id) and sub["state"] == "queued"

    st = cli.wait(task_id)
    assert st["state"] == "succeeded" and st["tool_name"] == "exercise"
    shown = ok(cli.run("show", task_id))
    assert task_id in shown and "succeeded" in shown

    logs = ok(cli.run("logs", task_id)).splitlines()
    assert [ln.split()[-2:] for ln in logs] == [["line", "0"], ["line", "1"], ["line", "2"]]
    assert all(ln.split()[1] == "stdout" for ln in logs)
    last = ok(cli.run("logs", task_id, "--from-end", "--limit", "1")).splitlines()
    assert len(last) == 1 and last[0].endswith("line 2")

    res = cli.json("result", task_id)
    assert res["result"]["answer"] == 42 and res["error"] is None
    assert '"answer": 42' in ok(cli.run("result", task_id))


def test_submit_prints_the_new_task(cli: Cli) -> None:
    out = ok(cli.run("submit", "exercise", "--priority", "5"))
    [task_id] = TASK_ID.findall(out)
    assert "queued" in out
    assert cli.json("show", task_id)["priority"] == 5
    cli.wait(task_id)


def test_list_shows_the_tasks_newest_first(cli: Cli) -> None:
    first = cli.json("submit", "exercise")["task_id"]
    second = cli.json("submit", "exercise")["task_id"]
    for t in (first, second):
        cli.wait(t)
    listed = cli.json("list")
    assert [t["task_id"] for t in listed["tasks"]] == [second, first]
    table = ok(cli.run("list"))
    assert TASK_ID.findall(table) == [second, first]
    assert table.count("succeeded") == 2
    # Paging: one per page, the cursor printed for the next.
    page = cli.run("list", "--limit", "1")
    assert TASK_ID.findall(ok(page)) == [second]
    cursor = re.search(r"--cursor (\S+)", page.stderr).group(1)
    assert TASK_ID.findall(ok(cli.run("list", "--limit", "1", "--cursor", cursor))) == [first]
    # The server can also come from the environment.
    by_env = controlplane("tasks", "list", "--json", env=user_env(CONTROLPLANE_URL=cli.url))
    assert [t["task_id"] for t in json.loads(ok(by_env))["tasks"]] == [second, first]


def test_list_prints_whole_task_ids_in_an_80_column_terminal(cli: Cli) -> None:
    task_id = cli.json("submit", "exercise")["task_id"]
    cli.wait(task_id)
    table = ok(controlplane("tasks", "list", "--url", cli.url, env=user_env(COLUMNS="80")))
    assert task_id in table


def test_cancel_stops_a_running_task(cli: Cli) -> None:
    task_id = cli.json("submit", "exercise", "--inputs", '{"sleep_s": 120, "progress_steps": 120}')["task_id"]
    cli.wait(task_id, {"running"})
    out = cli.json("cancel", task_id, "--reason", "changed my mind")
    assert out["acknowledged"] is True and out["state"] in ("cancel_requested", "cancelling", "cancelled")
    st = cli.wait(task_id)
    assert st["state"] == "cancelled" and st["error"]["code"] == "CANCELLED"
    again = ok(cli.run("cancel", task_id))
    assert "nothing to cancel" in again


def test_a_task_waits_for_another_and_a_cancel_cascades(cli: Cli) -> None:
    parent = cli.json("submit", "exercise", "--inputs", '{"sleep_s": 120, "progress_steps": 120}')["task_id"]
    child = cli.json("submit", "exercise", "--after", parent)
    assert child["state"] == "waiting"
    listed = cli.json("list", "--parent", parent)
    assert [t["task_id"] for t in listed["tasks"]] == [child["task_id"]]
    cli.json("cancel", parent, "--cascade")
    st = cli.wait(child["task_id"])
    assert st["state"] == "cancelled" and parent in st["error"]["message"]
    cli.wait(parent)


def test_errors_are_short_and_exit_non_zero(cli: Cli, tmp_path: Path) -> None:
    unknown = cli.run("show", "tsk_" + "a" * 26)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "NOT_FOUND: task not found" in unknown.stderr

    bad = cli.run("submit", "exercise", "--inputs", '{"sleep_s": -1}')
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr and "inputs.sleep_s" in bad.stderr

    not_json = cli.run("submit", "exercise", "--inputs", "{oops")
    assert not_json.returncode == 2 and "--inputs must be a JSON object" in not_json.stderr

    nobody = controlplane("tasks", "list", "--url", "http://127.0.0.1:9/mcp")
    assert nobody.returncode == 3 and "cannot reach http://127.0.0.1:9/mcp" in nobody.stderr
    for done in (unknown, bad, not_json, nobody):
        assert "Traceback" not in done.stderr


def test_demo_runs_end_to_end(home: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    done = controlplane("demo", "--home", str(home), env=user_env(), cwd=workdir, timeout=300)
    out = ok(done)
    assert "downloaded and verified" in out
    assert "succeeded" in out and "trajectory.xyz" in out
    # The demo's job is over and none of its processes outlived it.
    pidfiles = list((home / "jobs").glob("*/runner.pid"))
    assert len(pidfiles) == 1
    pid = json.loads(pidfiles[0].read_text())["pid"]
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(pid)
