"""The SQLAlchemy engines of one database URL, and each engine's connection settings.

SQLite: WAL, `synchronous=FULL`, one writer at a time (BEGIN IMMEDIATE, and an in-process lock
per file), per-thread read connections and a write engine that never waits. PostgreSQL: psycopg 3
pooled by SQLAlchemy, a pool of autocommit connections for prebuilt reads, and sessions ended by
the server when idle inside a transaction. docs/design/store.md says why each.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, make_url
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import ConnectionPoolEntry, SingletonThreadPool

IDLE_IN_TRANSACTION_S = 5.0  # PostgreSQL: a session idle inside a transaction this long is ended

_FILE_LOCKS: dict[str, threading.RLock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


class ThreadConnections(SingletonThreadPool):
    """One connection per thread, as SingletonThreadPool keeps them, except that past `pool_size`
    only connections of threads that have ended are closed: SingletonThreadPool closed any, also
    one another thread was using (on SQLite a crash of the process, once enough worker threads
    had come and gone). The pool grows past `pool_size` while that many threads live."""

    def _create_connection(self) -> ConnectionPoolEntry:
        entry = super()._create_connection()
        entry.info["owner"] = weakref.ref(threading.current_thread())
        return entry

    def _cleanup(self) -> None:
        for entry in [e for e in self._all_conns if not _owner_alive(e)]:
            self._all_conns.discard(entry)
            entry.close()


def _owner_alive(entry: ConnectionPoolEntry) -> bool:
    owner = entry.info.get("owner")
    thread = owner() if owner is not None else None
    return thread is not None and thread.is_alive()


class CannotOpenDatabase(Exception):
    """The database URL names no engine the store runs on, or its database could not be opened.
    The message is for the operator: it names the database (never its password) and the reason."""


def engine_url(url: str) -> str:
    """The URL SQLAlchemy is given: `postgresql://` (and libpq's `postgres://`) means psycopg 3,
    whichever driver SQLAlchemy would pick for a bare `postgresql://` (psycopg2 before 2.1)."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


class Engines:
    """The engines of one database: `engine` for writes and migrations, `read_engine` for reads,
    `fetch_engine` for prebuilt reads, and on SQLite `nonblocking_engine` for writes tried on the
    event loop, with `write_lock` (None on PostgreSQL). Raises CannotOpenDatabase for a URL that
    names neither engine; nothing connects until first used."""

    def __init__(self, url: str, *, echo: bool = False):
        url = engine_url(url)
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if not self.is_sqlite and not url.startswith("postgresql+psycopg"):
            raise CannotOpenDatabase("the database URL must be sqlite:///<path> or postgresql://<user>@<host>/<db>")
        if self.is_sqlite:
            path = url.split("///", 1)[-1] if "///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(url, echo=echo, pool_size=8, max_overflow=16,
                                                connect_args={"check_same_thread": False, "timeout": 30})
            _install_sqlite_hooks(self.engine)
            # Reads keep one connection per thread: WAL readers never wait for writers, so the
            # event loop can read inline, without a hop to a worker thread or a pool checkout.
            self.read_engine: Engine = create_engine(url, echo=echo, poolclass=ThreadConnections,
                                                     pool_size=64, connect_args={"check_same_thread": False})
            _install_sqlite_hooks(self.read_engine)
            self.fetch_engine = self.read_engine
            # Writes tried on the event loop never wait for the lock (busy timeout 0): when
            # another writer holds it, the caller retries in a worker thread instead.
            self.nonblocking_engine: Engine = create_engine(url, echo=echo, poolclass=ThreadConnections,
                                                            pool_size=4, connect_args={"check_same_thread": False})
            _install_sqlite_hooks(self.nonblocking_engine, busy_timeout_ms=0)
        else:
            # psycopg 3 under SQLAlchemy's QueuePool (not psycopg_pool): bounded, pre-pinged, and
            # emptied at once on a disconnect. The server ends a session idle inside a
            # transaction after IDLE_IN_TRANSACTION_S, so a stopped process frees its locks.
            connect_args = {"application_name": "controlplane",
                            "options": f"-c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_S * 1000)}"}
            self.engine = create_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, max_overflow=20,
                                        connect_args=connect_args)
            self.read_engine = self.engine
            # Prebuilt reads: autocommit and no pre-ping, one round trip each (`Statements.fetch`
            # tries a read once more on a new connection when the one it had was dead).
            self.fetch_engine = create_engine(url, echo=echo, isolation_level="AUTOCOMMIT", pool_size=4,
                                              max_overflow=8, connect_args=connect_args)
        # Writers of this process queue on a lock of their own and are woken the moment it is
        # free (SQLite's busy handler would have them sleep); other processes meet SQLite's lock.
        self.write_lock: threading.RLock | None = _file_lock(url) if self.is_sqlite else None

    def connect(self) -> Connection:
        """A connection of `engine`, or CannotOpenDatabase naming the database (never its
        password) and why it could not be opened."""
        try:
            return self.engine.connect()
        except OperationalError as e:
            reason = " ".join(ln.strip() for ln in str(e.orig).splitlines() if ln.strip()) or type(e.orig).__name__
            named = make_url(self.url)
            named = named if self.is_sqlite else named.set(drivername="postgresql")  # as the operator wrote it
            shown = named.render_as_string(hide_password=True)
            raise CannotOpenDatabase(f"cannot open the database {shown}: {reason}") from None

    def dispose(self) -> None:
        """Close every pooled connection of every engine."""
        self.engine.dispose()
        self.read_engine.dispose()
        self.fetch_engine.dispose()
        if self.is_sqlite:
            self.nonblocking_engine.dispose()


def _file_lock(url: str) -> threading.RLock:
    """One write lock per database file in this process, whichever `Database` opened it."""
    path = url.split("///", 1)[-1] if "///" in url else url
    key = path if path in ("", ":memory:") else str(Path(path).resolve())
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(key, threading.RLock())


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int = 30000) -> None:
    """Each new SQLite connection gets the store's pragmas, and each transaction its BEGIN:
    IMMEDIATE (the write lock up front) for a connection marked `cp_write`."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")  # a committed task survives power loss
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # Savepoint journals, sorts and temporary tables in memory: only ever read within an open
        # transaction (crash recovery is the WAL's).
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("cp_write"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")
