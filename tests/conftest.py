"""Shared fixtures: a control plane on a temporary home with fast loops, MCP clients that speak
to it (in memory, over HTTP, over stdio), and helpers that read like an agent's calls.

Both engines. Every test that uses the `home` fixture (directly, or through `settings`, `cp`,
`agent`, `server_process`, ...) runs twice: `[sqlite]` on the home's own SQLite file and
`[postgres]` on a fresh database of the session's PostgreSQL cluster (`tests/postgres.py`). The
database is handed over the way an operator does it, as CONTROLPLANE_DATABASE_URL: every
`Settings()` the test builds reads it, and `fast_env` passes it to server subprocesses. Tests
that do not use `home` build nothing on the store (catalogs, parsers, fakes, object stores) and
run once. A test or module about SQLite itself (its file, locks, WAL, query plans) is marked
`@pytest.mark.sqlite_only("why")` and runs on SQLite alone. Without PostgreSQL on the machine the
`[postgres]` variants skip, unless CONTROLPLANE_REQUIRE_POSTGRES=1 (`.ci/run`) makes them fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import fastmcp_tasks  # noqa: F401 - imported for its side effect, undone below
import psutil
import pytest
from fastmcp import Client
from fastmcp.client import extension_hooks

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.cloud import stop
from tests.postgres import Cluster, bindir, pg_cluster, require_or_skip

if TYPE_CHECKING:
    from controlplane.store.db import Database

# Importing fastmcp_tasks makes every fastmcp Client opt into native tasks (and then poll a
# catalog tool's task to its end). The tests opt in explicitly, per client, with
# `extensions=[TasksClientExtension()]`, so that both kinds of client are exercised.
extension_hooks._internal_client_extension_factories.clear()

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "expired"}
ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("sqlite", "postgres")
# The tests choose the database (the `engine` fixture); one named in the shell plays no part.
os.environ.pop("CONTROLPLANE_DATABASE_URL", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only(reason): about SQLite itself; no [postgres] variant")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only")
        metafunc.parametrize("engine", ["sqlite"] if only else list(ENGINES), indirect=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[Cluster | None]:
    """The session's PostgreSQL cluster (None where PostgreSQL is not installed)."""
    if bindir() is None:
        yield None
        return
    with pg_cluster() as cluster:
        yield cluster


@pytest.fixture
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test's database engine: its URL is CONTROLPLANE_DATABASE_URL while the test runs."""
    if request.param == "sqlite":
        monkeypatch.delenv("CONTROLPLANE_DATABASE_URL", raising=False)
        yield "sqlite"
        return
    cluster = request.getfixturevalue("pg")
    if cluster is None:
        require_or_skip("its binaries (initdb, postgres) were not found")
    with cluster.database() as url, closing_databases(monkeypatch):
        monkeypatch.setenv("CONTROLPLANE_DATABASE_URL", url)
        yield "postgres"


@contextmanager
def closing_databases(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `Database` opened inside is disposed at the end, before its database is dropped.
    Left to the garbage collector, psycopg warns from `__del__` about each open connection at
    whatever moment the collector runs (on CPython 3.11.7, in the middle of a compile, this
    became a SystemError in a later test)."""
    from controlplane.store.db import Database

    opened: list[Database] = []
    init = Database.__init__

    def tracked(self: Database, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        opened.append(self)

    monkeypatch.setattr(Database, "__init__", tracked)
    try:
        yield
    finally:
        monkeypatch.setattr(Database, "__init__", init)
        for db in opened:
            db.dispose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


FAST = dict(scheduler_interval_s=0.1, reconcile_interval_s=0.2, heartbeat_interval_s=0.5, heartbeat_timeout_s=20,
            kill_grace_s=1.0, leader_lease_s=3.0, claim_wait_s=2.0)


@pytest.fixture
def empty_db_url(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a database with nothing in it yet (no tables), on the test's engine."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    cluster = request.getfixturevalue("pg")
    name = cluster.empty_database()
    try:
        yield cluster.url(name)
    finally:
        cluster.drop(name)


def fast_env(home: Path, **extra: Any) -> dict[str, str]:
    """Environment for a server subprocess with the fast test settings (and the test's database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["CONTROLPLANE_HOME"] = str(home)
    if os.environ.get("CONTROLPLANE_DATABASE_URL"):
        env["CONTROLPLANE_DATABASE_URL"] = os.environ["CONTROLPLANE_DATABASE_URL"]
    for k, v in {**FAST, **extra}.items():
        env[f"CONTROLPLANE_{k.upper()}"] = str(v)
    return env


@pytest.fixture
def home(tmp_path: Path, engine: str) -> Path:
    return tmp_path / "home"


@pytest.fixture
def settings(home: Path) -> Settings:
    return Settings(home=home, **FAST)


@pytest.fixture
def cp(settings: Settings) -> ControlPlane:
    return ControlPlane(settings)


def catalog_text(*, concurrency: int = 2, queue_length: int = 1000, exercise_retry: str = "{ max_attempts = 1 }") -> str:
    """The default catalog with the cpu_small queue and the exercise retry policy changed."""
    from controlplane.catalog import default_catalog_text

    text = default_catalog_text()
    old_rc = "[resource_classes.cpu_small]\nmax_concurrency = 2\nmax_queue_length = 1000"
    old_retry = "estimate_s = 1\nretry = { max_attempts = 1 }"
    assert old_rc in text and old_retry in text
    text = text.replace(old_rc, f"[resource_classes.cpu_small]\nmax_concurrency = {concurrency}\n"
                                f"max_queue_length = {queue_length}")
    return text.replace(old_retry, f"estimate_s = 1\nretry = {exercise_retry}")


def write_catalog(home: Path, **kw: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text(**kw))


class ToolCallError(Exception):
    def __init__(self, data: dict[str, Any]):
        super().__init__(f"{data.get('code')}: {data.get('message')}")
        self.code = data.get("code")
        self.data = data


class Agent:
    """An MCP client used the way an agent uses it: call, read JSON, handle error codes."""

    def __init__(self, client: Client):
        self.client = client

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        res = await self.client.call_tool(tool, args, raise_on_error=False)
        data = json.loads(res.content[0].text)
        if res.is_error:
            raise ToolCallError(data)
        assert res.structured_content == data
        return data

    async def error(self, tool: str, **args: Any) -> dict[str, Any]:
        res = await self.client.call_tool(tool, args, raise_on_error=False)
        assert res.is_error, f"{tool} succeeded: {res.content[0].text}"
        return json.loads(res.content[0].text)

    async def submit(self, tool: str = "exercise", **kw: Any) -> str:
        return (await self.call("submit_task", tool_name=tool, **kw))["task_id"]

    async def wait(self, task_id: str, states: set[str] | None = None, timeout: float = 60) -> dict[str, Any]:
        import anyio

        states = states or TERMINAL
        deadline = time.monotonic() + timeout
        while True:
            st = await self.call("get_task_status", task_id=task_id)
            if st["state"] in states:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} still {st['state']} after {timeout}s: {st}")
            await anyio.sleep(0.05)

    async def provider_log_messages(self, task_id: str, limit: int) -> list[str]:
        """The job's native log (source='provider'), read page by page until a page is empty."""
        seen: list[str] = []
        cursor = None
        for _ in range(50):
            args: dict[str, Any] = {"task_id": task_id, "source": "provider", "limit": limit}
            if cursor:
                args["cursor"] = cursor
            page = await self.call("tail_task_logs", **args)
            assert page["next_cursor"].startswith("plog_")
            if not page["lines"]:
                break
            seen += [ln["message"] for ln in page["lines"]]
            cursor = page["next_cursor"]
        return seen

    async def all_logs(self, task_id: str) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        cursor = None
        while True:
            args: dict[str, Any] = {"task_id": task_id, "limit": 1000}
            if cursor:
                args["cursor"] = cursor
            page = await self.call("tail_task_logs", **args)
            lines.extend(page["lines"])
            cursor = page["next_cursor"]
            if not page["has_more"]:
                return lines


@pytest.fixture
async def agent(cp: ControlPlane) -> AsyncIterator[Agent]:
    async with Client(build_server(cp)) as client:
        yield Agent(client)


# ---- server subprocesses ------------------------------------------------------------------------
class ServerProcess:
    """`controlplane serve` in a subprocess (the real thing an agent connects to)."""

    def __init__(self, home: Path, env: dict[str, str] | None = None, transport: str = "http"):
        self.home = home
        self.env = env or fast_env(home)
        self.transport = transport
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self, timeout: float = 30) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        said: list[str] = []  # what it printed before it failed: the reason it did not start
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline().decode()
            said.append(line)
            m = re.search(r"serving MCP at (\S+)", line)
            if m:
                self.url = m.group(1)
                # keep draining stderr so the server never blocks on a full pipe
                import threading

                threading.Thread(target=self._drain, daemon=True).start()
                return self
            if not line and self.proc.poll() is not None:
                break
        said.append(self.proc.stderr.read().decode() if self.proc.poll() is not None else "")
        raise RuntimeError(f"server did not start: {''.join(said)[-2000:]}")

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for _ in iter(self.proc.stderr.readline, b""):
            pass

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye (the crash a restart must survive)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc:
            stop(self.proc)


@pytest.fixture
def server_process(home: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(home)
    yield srv
    srv.stop()
    reap_jobs(home)


def runner_start_times(job_dir: Path) -> list[float]:
    """When each runner that started a local job did so: the '# started NAME at T' line a runner
    writes on the job's console as it claims the job (one that found it claimed writes another)."""
    console = job_dir / "console.log"
    if not console.exists():
        return []
    return [float(line.split(" at ", 1)[1].split()[0])
            for line in console.read_text(errors="replace").splitlines() if line.startswith("# started ")]


def runner_starts(job_dir: Path) -> int:
    return len(runner_start_times(job_dir))


def reap_jobs(home: Path) -> None:
    """Kill any runner a test left behind (a test owns every process it starts), and reap the
    ones this process started: a control plane stopped before it polled its runners leaves them
    to pytest, which would otherwise hold them as zombies for the rest of the run."""
    jobs = home / "jobs"
    if not jobs.exists():
        return
    for pidfile in jobs.glob("*/runner.pid"):
        try:
            pid = json.loads(pidfile.read_text())["pid"]
            p = psutil.Process(pid)
            for c in p.children(recursive=True):
                c.kill()
            p.kill()
            if p.ppid() == os.getpid():
                p.wait(timeout=5)
        except (psutil.Error, ValueError, KeyError, OSError):
            pass


@pytest.fixture(autouse=True)
def _no_leftover_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    # (asking for `home` in the signature would give every test an engine)
    home = request.getfixturevalue("home") if "home" in request.fixturenames else None
    yield
    if home is not None:
        reap_jobs(home)


def query_plan(db: Database, conn: Any, stmt: Any, params: dict[str, Any]) -> list[str]:
    """How the engine would run a prebuilt statement (`Database.run`'s SQL and parameters) on
    `conn`: SQLite's EXPLAIN QUERY PLAN details, or PostgreSQL's EXPLAIN lines."""
    sql, names, fixed = db._compiled_for(stmt, params)
    args = {**fixed, **params}
    if db.is_sqlite:
        return [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, tuple(args[n] for n in names or []))]
    return [r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, args)]


def record_statements(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every statement the control plane's database runs from now on (and the name of every lock
    it takes), in order: what a test of "costs no statement more" counts."""
    seen: list[Any] = []
    run, fetch, lock = cp.db.run, cp.db.fetch, cp.db.lock
    monkeypatch.setattr(cp.db, "run", lambda c, stmt, params: (seen.append(stmt), run(c, stmt, params))[1])
    monkeypatch.setattr(cp.db, "fetch", lambda stmt, params, **kw: (seen.append(stmt), fetch(stmt, params, **kw))[1])
    monkeypatch.setattr(cp.db, "lock", lambda c, *keys: (seen.extend(keys), lock(c, *keys))[1])
    return seen


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def tree_pids(agent: Agent, task_id: str, children: int, timeout: float = 60) -> list[int]:
    """Pids the exercise tool printed for its children and grandchildren."""
    deadline = time.monotonic() + timeout
    while True:
        lines = await agent.all_logs(task_id)
        # Siblings share the tool's stdout: parse every pid in a line, not the first.
        pids = [int(p) for ln in lines for p in re.findall(r"child pid=(\d+)", ln["message"])]
        if len(pids) >= 2 * children:
            return pids
        if time.monotonic() > deadline:
            procs = [(p.pid, p.ppid(), p.status(), p.cmdline()[-2:]) for p in psutil.process_iter()
                     if p.pid in pids or p.ppid() in pids]
            raise AssertionError(f"tool printed only {pids}; log: {[ln['message'] for ln in lines]}; "
                                 f"processes: {procs}")
        await anyio.sleep(0.1)


async def all_dead(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        await anyio.sleep(0.05)
    return False


def most_in_one_second(times: list[float]) -> int:
    """The most events inside any one-second window (how a per-second rate limit is judged)."""
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - 1.0:
            j += 1
        best = max(best, i - j + 1)
    return best


@asynccontextmanager
async def serving(cp: ControlPlane) -> AsyncIterator[Any]:
    """The HTTP server in this process (`controlplane.serve.HttpServer`), on 127.0.0.1."""
    import asyncio

    from controlplane.serve import HttpServer

    server = HttpServer(cp)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the HTTP server did not start"
            await asyncio.sleep(0.01)
        yield server
    finally:
        server.stop()
        await task


@pytest.fixture
async def http_server(cp: ControlPlane) -> AsyncIterator[Any]:
    async with serving(cp) as server:
        yield server


@pytest.fixture
def idp() -> Iterator[Any]:
    """An OpenID provider on 127.0.0.1 that signs the tests' tokens (tests/oidc.py's FakeIdP)."""
    from tests.oidc import FakeIdP

    provider = FakeIdP().start()
    yield provider
    provider.stop()


async def expire_soon(cp: ControlPlane, tid: str) -> None:
    """Reconcile until the task expired: a job whose runner is still exiting keeps its directory
    (and its task) for one more cycle."""
    import anyio

    deadline = time.monotonic() + 10
    while cp.store.tasks.get(tid).state != "expired":
        assert time.monotonic() < deadline, "the task did not expire"
        await cp.reconciler.cycle()
        await anyio.sleep(0.05)


@pytest.fixture(scope="session")
def built() -> Iterator[Any]:
    """The sdist and the wheel of this checkout, built once a session (tests/installed.py)."""
    from tests.installed import build, outside_the_checkout

    with outside_the_checkout("mcp-controlplane-dist-") as out:
        yield build(out)


@pytest.fixture(scope="session")
def installed(built: Any) -> Iterator[Any]:
    """The wheel alone installed non-editable in a fresh venv outside the checkout, as `pipx
    install mcp-controlplane` or `uvx mcp-controlplane` installs it (tests/installed.py)."""
    from tests.installed import install, outside_the_checkout

    with outside_the_checkout("mcp-controlplane-venv-") as root:
        yield install(built.wheel, root / "venv")
