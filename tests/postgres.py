"""A throwaway PostgreSQL for the tests: one cluster per test session, one database per test.

`pg_cluster()` runs `initdb` in a temporary directory and starts `postgres` on a free port of
127.0.0.1 (its unix socket inside that directory, fsync off: nothing here needs to survive a
crash of the machine), migrates one template database, and on exit stops the server by its pid
and removes the directory. `Cluster.database()` gives each test a fresh, migrated database in a
few tens of milliseconds (`CREATE DATABASE ... TEMPLATE`), dropped afterwards.

The binaries come from Debian's `postgresql` package (`.ci/run` installs it), which keeps them
off PATH under /usr/lib/postgresql/<version>/bin: they are found through `pg_config --bindir`,
that directory, or PATH (`CONTROLPLANE_PG_BINDIR` overrides all three). Where there are none, the
PostgreSQL variants of the tests are skipped, unless CONTROLPLANE_REQUIRE_POSTGRES=1 (set by
`.ci/run`), which turns the skip into a failure.

initdb and postgres refuse to run as root (CI containers often are): as root, the cluster's
directory is given to an unprivileged user (`postgres`, which the package creates, else
`nobody`) and both run as that user (`subprocess`'s user/group switch, no sudo needed).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cloud import free_port

REQUIRE = "CONTROLPLANE_REQUIRE_POSTGRES"
TEMPLATE = "cp_template"


def bindir() -> Path | None:
    """The directory holding initdb and postgres, or None where PostgreSQL is not installed."""
    if "CONTROLPLANE_PG_BINDIR" in os.environ:  # the one place to look (nowhere, if it has no initdb)
        candidates = [os.environ["CONTROLPLANE_PG_BINDIR"]]
    else:
        candidates = []
        if shutil.which("pg_config"):  # Debian's wrapper names the newest installed version's
            try:
                candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                                 timeout=10).stdout.strip())
            except (OSError, subprocess.SubprocessError):
                pass
        # Debian: one directory per major version, newest first
        candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True,
                             key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
        if shutil.which("initdb"):
            candidates.append(str(Path(shutil.which("initdb") or "").resolve().parent))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "postgres").exists():
            return Path(c)
    return None


def require_or_skip(reason: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"PostgreSQL is required ({REQUIRE}=1) but {reason}")
    pytest.skip(f"PostgreSQL variant skipped: {reason} (install Debian's postgresql package; .ci/run does)")


def _run_as() -> dict[str, object]:
    """Popen arguments that drop root to an unprivileged user; nothing when not root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


class Cluster:
    def __init__(self, bin_dir: Path, base: Path, port: int, proc: subprocess.Popen[bytes]):
        self.bin_dir = bin_dir
        self.base = base
        self.port = port
        self.proc = proc

    def url(self, dbname: str) -> str:
        return f"postgresql://cp@127.0.0.1:{self.port}/{dbname}"

    def admin(self) -> object:
        import psycopg

        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=cp dbname=postgres", autocommit=True)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A fresh database migrated to head (a copy of the template); dropped afterwards, with
        whatever sessions a test left open on it (a killed server's, say)."""
        name = f"t_{secrets.token_hex(6)}"
        with self.admin() as c:  # type: ignore[attr-defined]
            c.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        try:
            yield self.url(name)
        finally:
            with self.admin() as c:  # type: ignore[attr-defined]
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def empty_database(self) -> str:
        """A database with nothing in it (for migrating from scratch); the caller drops it."""
        name = f"e_{secrets.token_hex(6)}"
        with self.admin() as c:  # type: ignore[attr-defined]
            c.execute(f"CREATE DATABASE {name}")
        return name

    def drop(self, name: str) -> None:
        with self.admin() as c:  # type: ignore[attr-defined]
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}")
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} user=cp dbname=postgres", connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise RuntimeError(f"postgres did not accept connections on 127.0.0.1:{port} within {timeout}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Immediate shutdown (SIGQUIT: no checkpoint, the data is thrown away), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def pg_cluster(durable: bool = False) -> Iterator[Cluster]:
    """initdb, start, migrate the template; stop and remove everything at the end. `durable`
    keeps PostgreSQL's defaults of fsync and synchronous commit (a benchmark against SQLite,
    which syncs its commits); the tests turn them off."""
    bin_dir = bindir()
    if bin_dir is None:
        raise FileNotFoundError("initdb")
    as_user = _run_as()
    # Not under pytest's tmp: root's is private (0700) and deep (a unix socket path holds 107 bytes).
    base = Path(tempfile.mkdtemp(prefix="cp-pg-", dir="/tmp" if as_user and os.path.isdir("/tmp") else None))
    proc: subprocess.Popen[bytes] | None = None
    try:
        if as_user:
            os.chown(base, as_user["user"], as_user["group"])  # type: ignore[arg-type]
        log = base / "initdb.log"
        with open(log, "wb") as out:
            rc = subprocess.run([str(bin_dir / "initdb"), "-D", str(base / "data"), "-U", "cp", "--auth=trust",
                                 "-E", "UTF8", "--locale=C", "--no-sync"], stdout=out, stderr=subprocess.STDOUT,
                                cwd=base, **as_user).returncode  # type: ignore[call-overload]
        if rc != 0:
            raise RuntimeError(f"initdb failed: {log.read_text()[-2000:]}")
        server_log = base / "postgres.log"
        for _ in range(3):  # the free port may be taken between finding it and binding it
            port = free_port()
            with open(server_log, "ab") as out:
                proc = subprocess.Popen(
                    [str(bin_dir / "postgres"), "-D", str(base / "data"), "-p", str(port),
                     "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={base}",
                     *([] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off",
                                           "-c", "full_page_writes=off"]),
                     "-c", "shared_buffers=32MB", "-c", "max_connections=400", "-c", "log_min_messages=warning"],
                    stdout=out, stderr=subprocess.STDOUT, cwd=base, **as_user)  # type: ignore[call-overload]
            try:
                _wait_ready(port, proc)
                break
            except RuntimeError:
                _stop(proc)
                proc = None
        if proc is None:
            raise RuntimeError(f"postgres did not start: {server_log.read_text(errors='replace')[-2000:]}")
        cluster = Cluster(bin_dir, base, port, proc)
        with cluster.admin() as c:  # type: ignore[attr-defined]
            c.execute(f"CREATE DATABASE {TEMPLATE}")
        from controlplane.store.db import Database

        db = Database(cluster.url(TEMPLATE))
        db.upgrade()
        db.dispose()
        yield cluster
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(base, ignore_errors=True)



def waiting_on_a_lock(engine: Any) -> bool:
    """Whether a session of `engine`'s database waits for a lock now (PostgreSQL's own view)."""
    from sqlalchemy import text

    with engine.connect() as c:
        return bool(c.execute(text("SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND datname = current_database()")).scalar_one())


class Meeting:
    """Two calls forced to meet on PostgreSQL: `first` runs until it calls `pause()` (from a
    wrapped method of the control plane's own), then `second` starts and runs until a session
    waits for a lock, then `first` goes on. Where their locks form a cycle PostgreSQL fails one."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.held, self.go = threading.Event(), threading.Event()

    def pause(self) -> None:
        """Called by the first call where it must wait for the second (the first time only)."""
        if not self.held.is_set():
            self.held.set()
            self.go.wait(30)

    def run(self, first: Callable[[], Any], second: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
        """Both calls, met as above: their answers (in the order given; None for one that
        raised) and the errors they raised."""
        out: list[Any] = [None, None]
        errors: list[BaseException] = []

        def call(i: int, fn: Callable[[], Any]) -> None:
            try:
                out[i] = fn()
            except Exception as e:  # (the caller's assertion says it)
                errors.append(e)

        threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate((first, second))]
        threads[0].start()
        assert self.held.wait(30), "the first call never paused"
        threads[1].start()
        for _ in range(300):  # the second waits for a lock the first holds
            if waiting_on_a_lock(self.engine):
                break
            threads[1].join(0.05)
        self.go.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a call never finished"
        return out, errors
