"""Database engines and transactions: the one module that knows which SQL engine is in use.

Everything engine-specific lives here: SQLite's WAL/synchronous pragmas and its
`BEGIN IMMEDIATE` write transactions, PostgreSQL's row locks and advisory locks, upserts, and
running the alembic migrations. The store speaks portable SQLAlchemy Core and calls these
helpers where engines differ. The differences, each in one place:

* connections: SQLite keeps per-thread read connections and a write engine that never waits;
  PostgreSQL goes through psycopg 3, pooled by SQLAlchemy (`Database.__init__` says why);
* writers: SQLite has one at a time (an in-process lock, then BEGIN IMMEDIATE), so a write may
  run on the event loop when the lock is free; on PostgreSQL every read and write leaves the loop
  (`WouldBlock`), rows are locked explicitly (`for_update`, claims skip locked rows) and
  admission into a queue takes an advisory lock (`lock_queue`), as do the migrations (`upgrade`);
* parameters: qmark for sqlite3, pyformat for psycopg (`_compiled_for`);
* upserts: each dialect's INSERT ... ON CONFLICT (`insert_ignore`, `upsert`);
* queue depths: kept by triggers on both, written in each engine's SQL (migrations 0007, 0009);
* text: PostgreSQL's holds no NUL and enforces varchar lengths, SQLite's keeps anything; what
  reaches the store is kept within both where it enters (`api`, the runner's `events`, `attempts`);
* planner hints: `likely()` is SQLite's and plain SQL elsewhere;
* change notification across processes: on PostgreSQL a write transaction NOTIFYs the ids of the
  tasks it changed (`notify_changed`) and every replica LISTENs (`ChangeFeed`); SQLite runs in one
  process (its writers share a file on one machine) and keeps the in-process path alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from operator import itemgetter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from sqlalchemy import Table, create_engine, event, make_url, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.pool import SingletonThreadPool
from sqlalchemy.sql.elements import ColumnElement

from controlplane.blocking import WouldBlock, is_inline, must_not_block

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
log = logging.getLogger("controlplane.store.db")


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic's INFO lines (its context, every migration applied) stay out of a server's start;
    its warnings and errors still show, and an operator who set alembic's logger lower keeps it."""
    alembic = logging.getLogger("alembic")
    before = alembic.level
    if before == logging.NOTSET or before > logging.DEBUG:
        alembic.setLevel(max(before, logging.WARNING))
    try:
        yield
    finally:
        alembic.setLevel(before)
# The PostgreSQL channel on which a committed change to a task is announced; the payload is the
# task's id (an `ids` id: far below NOTIFY's 8000-byte limit on a payload).
CHANGES_CHANNEL = "controlplane_task_changed"
T = TypeVar("T")
# A group commit's commit runs on the event loop while commits average no longer than this (a
# local disk's fsync), in a worker thread when they take longer (`Database.write_on_loop`).
LOOP_COMMIT_MAX_S = 0.002
IDLE_IN_TRANSACTION_S = 5.0  # PostgreSQL: a session idle inside a transaction this long is ended
Build = Callable[[list[str], list[tuple[Any, ...]]], list[Any]]  # (column names, driver tuples) -> rows


_FILE_LOCKS: dict[str, threading.RLock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def _file_lock(url: str) -> threading.RLock:
    """One write lock per database file in this process, whichever `Database` opened it."""
    path = url.split("///", 1)[-1] if "///" in url else url
    key = path if path in ("", ":memory:") else str(Path(path).resolve())
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(key, threading.RLock())


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


class Database:
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
            self.engine: Engine = create_engine(
                url,
                echo=echo,
                connect_args={"check_same_thread": False, "timeout": 30},
                pool_size=8,
                max_overflow=16,
            )
            _install_sqlite_hooks(self.engine)
            # Reads keep one connection per thread: WAL readers never wait for writers, so the
            # event loop can read inline, without a hop to a worker thread or a pool checkout.
            self.read_engine: Engine = create_engine(url, echo=echo, poolclass=SingletonThreadPool,
                                                     pool_size=64, connect_args={"check_same_thread": False})
            _install_sqlite_hooks(self.read_engine)
            self.fetch_engine = self.read_engine
            # Writes tried on the event loop itself never wait for the lock (busy timeout 0):
            # when another writer holds it, the caller retries in a worker thread instead.
            self.nonblocking_engine: Engine = create_engine(url, echo=echo, poolclass=SingletonThreadPool,
                                                            pool_size=4, connect_args={"check_same_thread": False})
            _install_sqlite_hooks(self.nonblocking_engine, busy_timeout_ms=0)
        else:
            # PostgreSQL through psycopg 3, pooled by SQLAlchemy's QueuePool rather than by
            # psycopg_pool. SQLAlchemy takes psycopg_pool only as `creator` under a NullPool, so
            # every checkout is a new connection to it: its psycopg dialect adds a notice handler
            # to the pooled connection at each one (391 of them after 3,000 reads, a leak), and
            # each pool runs worker threads that must be closed and that go on reconnecting to a
            # database that went away. QueuePool bounds the connections as well (pool_size, then
            # overflow), pre-ping replaces one the server or a proxy closed while it was idle,
            # and a disconnect seen on one invalidates the whole pool at once (a failover).
            # A transaction left open by a process that stopped (SIGSTOP, a VM paused, a GC pause
            # gone wrong) keeps its row and advisory locks: the lease row a paused leader holds
            # FOR SHARE would keep every other replica from taking over. The server ends such a
            # session after IDLE_IN_TRANSACTION_S; our transactions never sit idle that long.
            connect_args = {"application_name": "controlplane",
                            "options": f"-c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_S * 1000)}"}
            self.engine = create_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, max_overflow=20,
                                        connect_args=connect_args)
            self.read_engine = self.engine
            # The prebuilt reads (`fetch`: a task by id, a page of tasks or logs) have a pool of their
            # own, in autocommit and without pre-ping: one round trip per read, where a checkout's
            # ping, the query inside a transaction and its rollback made three. A connection found
            # dead is replaced and the read, which changes nothing, is tried once more (`fetch`).
            self.fetch_engine: Engine = create_engine(url, echo=echo, isolation_level="AUTOCOMMIT", pool_size=4,
                                                      max_overflow=8, connect_args=connect_args)
        # SQLite has one writer at a time. Writers of this process queue on a lock of their own
        # and are woken the moment it is free; left to SQLite's busy handler, each would sleep
        # 1, 2, 5, 10 ... ms between tries, and 16 concurrent submits spent most of their time
        # asleep (issue 13). Other processes still meet SQLite's lock and its busy timeout.
        self._write_lock: threading.RLock | None = _file_lock(url) if self.is_sqlite else None
        self._loop_tx: int | None = None  # the thread of the event loop while write_on_loop's tx is open
        self.commit_s = 0.0  # how long a group commit's commit takes, on average (`write_on_loop`)
        self._compiled: dict[Any, tuple[str, list[str] | None, dict[str, Any]]] = {}
        self._keep: list[Any] = []

    # ---- transactions ---------------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction. On SQLite it takes the write lock up front (BEGIN IMMEDIATE) so
        that read-then-write sequences never deadlock and are serialised across processes.

        On the event loop (`blocking.inline()`) it never waits: it raises `WouldBlock` when the
        lock is taken (SQLite), or at once on an engine reached over the network."""
        nonblocking = is_inline()
        if nonblocking and not self.is_sqlite:
            raise WouldBlock()
        if self._loop_tx is not None and self._loop_tx == threading.get_ident():
            # The loop's own transaction is open (write_on_loop) and commits only when the loop runs
            # again: an inline write goes to a worker thread and waits there; a blocking one here
            # would wait for ever.
            if nonblocking:
                raise WouldBlock()
            raise RuntimeError("a blocking write on the event loop while its group commit is open")
        lock = self._write_lock
        if lock is not None and not lock.acquire(blocking=not nonblocking):
            raise WouldBlock()
        try:
            with (self.nonblocking_engine if nonblocking else self.engine).connect() as conn:
                with _begin_write(conn, nonblocking):
                    yield conn
        finally:
            if lock is not None:
                lock.release()

    async def write_on_loop(self, fn: Callable[[Connection], T]) -> T:
        """`fn(conn)` in a write transaction whose statements run here, on the event loop, and so
        does its commit while commits are quick; raises `WouldBlock`, having done nothing, when
        the write lock is taken, or on an engine reached over the network.

        Why the statements on the loop: the sqlite3 module lets go of the GIL around every
        statement, and a worker thread that wants it back while the loop is busy waits up to the
        interpreter's switch interval (5 ms) each time. A group commit of a few submits (five
        statements each) then took 17 ms to seconds while the loop served other calls.

        Why the commit too: its fsync takes about 0.1-0.3 ms on a local disk, while a hop to a
        worker thread and back costs the loop far more under load than the time it waits there:
        with 16 clients submitting, a batch's hop (a thread that only slept 1.2 ms) cost 0.2 ms of
        server CPU per call, and committing on the loop instead took the submit ratio from 0.67 to
        0.75 (issue 13, `bench/concurrency.py`). A disk whose commits are slow (a network volume)
        would stall every call for each: once they average more than LOOP_COMMIT_MAX_S, commits
        go to a worker thread again, where they go on being timed."""
        lock = self._write_lock
        if lock is None or self._loop_tx is not None or not lock.acquire(blocking=False):
            raise WouldBlock()
        self._loop_tx = threading.get_ident()
        try:
            with self.nonblocking_engine.connect() as conn:
                tx = _begin_write(conn, nonblocking=True)
                try:
                    out = fn(conn)
                except BaseException:
                    tx.rollback()
                    raise
                # (a failed commit is rolled back by close)
                if self.commit_s <= LOOP_COMMIT_MAX_S:
                    self._timed_commit(tx)
                else:
                    await anyio.to_thread.run_sync(self._timed_commit, tx)
                return out
        finally:
            self._loop_tx = None
            lock.release()

    def _timed_commit(self, tx: Any) -> None:
        """Commit, and keep a moving average of how long commits take (`commit_s`)."""
        t0 = time.perf_counter()
        tx.commit()
        self.commit_s += (time.perf_counter() - t0 - self.commit_s) * 0.1

    def read(self) -> Connection:
        """A connection for reads (`with db.read() as c:`); it never writes. WAL readers never
        wait, so SQLite reads may run on the event loop; a networked engine's may not."""
        if not self.is_sqlite:
            must_not_block()
        return self.read_engine.connect()

    # ---- prebuilt statements, straight through the DB-API driver ---------------------------
    # The hot paths (a task by id, a page of logs, submit, transitions) run statements built once
    # at import. Compiling each once per engine and handing only the parameters to the driver
    # skips SQLAlchemy's per-call statement and result machinery, which on SQLite costs more
    # than the query itself. Only plain column types are used (numbers, text, booleans).
    # The drivers take parameters differently: sqlite3 by position (qmark: a list in the compiled
    # statement's order), psycopg by name (pyformat: the dict; the statement carries a cast for
    # each); `_compiled_for` says which. psycopg opens a transaction for any statement, so a
    # PostgreSQL read ends its own (`fetch`) rather than hand the pool a connection inside one.

    def fetch(self, stmt: Any, params: dict[str, Any], *, into: Build | None = None) -> list[Any]:
        """Run a prebuilt SELECT on the read connection: its rows as dicts, or `into(columns,
        tuples)` (a typed row's `many`, which skips the dicts)."""
        if self.is_sqlite:
            return self._fetch(stmt, params, into)
        must_not_block()
        try:
            return self._fetch(stmt, params, into)
        except DBAPIError as e:
            if not e.connection_invalidated:
                raise
            return self._fetch(stmt, params, into)  # on a new connection: the pool was emptied

    def _fetch(self, stmt: Any, params: dict[str, Any], into: Build | None) -> list[Any]:
        raw = self.fetch_engine.raw_connection()
        try:
            try:
                rows = self._run(raw.driver_connection, stmt, params, into)
            except DBAPIError as e:
                if not self.is_sqlite and self.fetch_engine.dialect.is_disconnect(e.orig, raw.driver_connection, None):
                    # The server or a proxy dropped it (a restart, a failover): so were its pool mates.
                    raw.invalidate(e.orig)
                    self.fetch_engine.dispose()
                    e.connection_invalidated = True
                raise
            return rows or []
        finally:
            raw.close()

    def run(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> list[dict[str, Any]] | int:
        """Run a prebuilt statement inside the transaction of `conn` (a `write()` connection).
        Returns the rows of a SELECT (or of RETURNING), else the number of rows affected."""
        return self._run(conn.connection.driver_connection, stmt, params)

    def command(self, conn: Connection, sql: str) -> None:
        """A statement without parameters or rows (SAVEPOINT, RELEASE ...) inside the transaction
        of `conn`, on the driver: through SQLAlchemy's execution machinery it cost a submit in a
        group commit a third of its own share of the batch."""
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()

    def run_many(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> None:
        """Run a prebuilt statement once for each of `rows` (parameter sets with the same keys)
        inside the transaction of `conn`, in one executemany: the reconciler records up to a
        page of provider statuses at once, and SQLAlchemy's executemany spent more building each
        row's parameters than the driver spent on the row."""
        if not rows:
            return
        sql, names, fixed = self._compiled_for(stmt, rows[0])
        if names is not None and not fixed and len(names) > 1:  # (itemgetter: a tuple per row, in C)
            args: Any = list(map(itemgetter(*names), rows))
        elif names is not None:
            args = [[r[n] if n in r else fixed[n] for n in names] for r in rows]
        else:
            args = [{**fixed, **r} for r in rows] if fixed else rows
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany(sql, args)
        except dbapi_error as e:
            raise DBAPIError.instance(sql, args[:1], e, dbapi_error) from e
        finally:
            cur.close()

    def _run(self, dbapi_conn: Any, stmt: Any, params: dict[str, Any],
             into: Build | None = None) -> list[Any] | int:
        sql, names, fixed = self._compiled_for(stmt, params)
        merged = {**fixed, **params}  # literals in the statement are bound parameters too
        args: Any = [merged[n] for n in names] if names is not None else merged
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        cur = dbapi_conn.cursor()
        try:
            cur.execute(sql, args)
            if cur.description is None:
                return cur.rowcount
            cols = [d[0] for d in cur.description]
            if into is not None:
                return into(cols, cur.fetchall())
            return [dict(zip(cols, r)) for r in cur.fetchall()]
        except dbapi_error as e:  # the same exceptions SQLAlchemy raises (IntegrityError, ...)
            raise DBAPIError.instance(sql, args, e, dbapi_error) from e
        finally:
            cur.close()

    def _compiled_for(self, stmt: Any, params: dict[str, Any]) -> tuple[str, list[str] | None, dict[str, Any]]:
        # INSERT and UPDATE compile to different SQL for different sets of columns.
        dml = stmt.is_dml
        key = (id(stmt), tuple(sorted(params))) if dml else id(stmt)
        entry = self._compiled.get(key)
        if entry is None:
            table_cols = set(stmt.table.c.keys()) if dml else set()
            compiled = stmt.compile(dialect=self.engine.dialect,
                                    column_keys=[k for k in params if k in table_cols] if dml else None)
            fixed = {k: v for k, v in compiled.params.items() if v is not None and k not in params}
            entry = (str(compiled), list(compiled.positiontup) if compiled.positional else None, fixed)
            self._compiled[key] = entry
            self._keep.append(stmt)  # keeps ids unique while the cache refers to them
        return entry

    def lock_queue(self, conn: Connection, name: str) -> None:
        """Serialise admission into one queue (queue-length checks) across processes.

        SQLite already serialises writers (BEGIN IMMEDIATE); PostgreSQL takes a transaction-
        scoped advisory lock keyed by the queue name."""
        self.lock_queues(conn, [name])

    def lock_queues(self, conn: Connection, names: Iterable[str]) -> None:
        """`lock_queue` for each of `names`, always in one order (sorted): a transaction that holds
        one and waits for another can then never be waited for by one that holds the other (two
        replicas' group commits naming two queues in opposite orders deadlocked, and PostgreSQL
        aborted one of them with every submit in it). A transaction takes all of its locks so."""
        if self.is_sqlite:
            return
        for name in sorted(set(names)):
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})

    def notify_changed(self, conn: Connection, task_ids: list[str]) -> None:
        """Inside a write transaction, just before it commits: announce to every replica that
        these tasks changed. PostgreSQL delivers a NOTIFY only if its transaction commits, and
        after the commit, so a listener that reads the task on hearing of it reads the new row;
        identical notifications of one transaction are delivered once. No-op on SQLite, whose
        writers are this process (the in-process `Writer.on_change` is the whole path)."""
        if self.is_sqlite or not task_ids:
            return
        conn.execute(text("SELECT pg_notify(:channel, id) FROM unnest(CAST(:ids AS text[])) AS id"),
                     {"channel": CHANGES_CHANNEL, "ids": task_ids})

    def change_feed(self, on_change: Callable[[str], None], on_connect: Callable[[], None]) -> ChangeFeed | None:
        """What feeds this process's progress hub with changes committed by other processes:
        a `ChangeFeed` on PostgreSQL, None on SQLite (nothing to listen to)."""
        return None if self.is_sqlite else ChangeFeed(self, on_change, on_connect)

    def for_update(self, stmt: Any, *, skip_locked: bool = False) -> Any:
        """Row-lock a SELECT inside a write transaction (no-op on SQLite, which locks the file).
        With `skip_locked`, rows another transaction holds are passed over (claiming queued work:
        a task being cancelled meanwhile is left to its cancel)."""
        return stmt if self.is_sqlite else stmt.with_for_update(skip_locked=skip_locked)

    def for_share(self, stmt: Any) -> Any:
        """A SELECT that keeps the rows it read from being changed until the transaction ends
        (FOR SHARE; no-op on SQLite, whose writers are serialised)."""
        return stmt if self.is_sqlite else stmt.with_for_update(read=True)

    def insert_ignore(self, table: Table) -> Any:
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        return insert(table).on_conflict_do_nothing()

    def upsert(self, table: Table, values: dict[str, Any], keys: list[str], where: Any = None,
               set_: dict[str, Any] | None = None) -> Any:
        """INSERT `values`, or on a conflict on `keys` update the other columns to the new values
        (`set_` overrides some with expressions of the row as it was), if `where` holds."""
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        stmt = insert(table).values(**values)
        update = {k: stmt.excluded[k] for k in values if k not in keys}
        update.update(set_ or {})
        return stmt.on_conflict_do_update(index_elements=keys, set_=update, where=where)

    # ---- schema -----------------------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        """Apply the alembic migrations. Safe when several processes start at once: SQLite runs
        them inside one IMMEDIATE transaction, PostgreSQL under an advisory lock."""
        with _quiet_alembic():
            from alembic import command

            cfg = self._alembic_config()
            cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
            with self._connect() as conn:
                conn.execution_options(cp_write=True)
                with conn.begin():
                    if not self.is_sqlite:
                        conn.execute(text("SELECT pg_advisory_xact_lock(7245531)"))
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, revision)

    def require_current(self) -> None:
        """CannotOpenDatabase unless the schema is at the newest migration this code has (for
        servers that do not migrate on start: `controlplane db upgrade` is their one-shot)."""
        with _quiet_alembic():
            from alembic.runtime.migration import MigrationContext
            from alembic.script import ScriptDirectory

            head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
            with self._connect() as conn:
                current = MigrationContext.configure(conn).get_current_revision()
        if current != head:
            raise CannotOpenDatabase(f"the database is at revision {current or '(none)'}, this server needs {head}: "
                                     "run `controlplane db upgrade` first (CONTROLPLANE_MIGRATE_ON_START is off)")

    @staticmethod
    def _alembic_config() -> Any:
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        return cfg

    def _connect(self) -> Any:
        """A connection, or CannotOpenDatabase naming the database (never its password) and why."""
        try:
            return self.engine.connect()
        except OperationalError as e:
            reason = " ".join(ln.strip() for ln in str(e.orig).splitlines() if ln.strip()) or type(e.orig).__name__
            named = make_url(self.url)
            named = named if self.is_sqlite else named.set(drivername="postgresql")  # as the operator wrote it
            shown = named.render_as_string(hide_password=True)
            raise CannotOpenDatabase(f"cannot open the database {shown}: {reason}") from None

    def current_revision(self) -> str | None:
        with _quiet_alembic():
            from alembic.runtime.migration import MigrationContext

            with self._connect() as conn:
                return MigrationContext.configure(conn).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()
        self.fetch_engine.dispose()
        if self.is_sqlite:
            self.nonblocking_engine.dispose()


class ChangeFeed:
    """LISTEN on PostgreSQL for tasks changed by any replica (`Database.notify_changed`) and hand
    each task id to `on_change` (the progress hub's, which reads the task again).

    One dedicated connection, outside the pool: a LISTEN belongs to a session, and a pooled
    connection is handed to other work (and reset) between checkouts. It is psycopg's async
    connection, run as a task of the event loop (`run()`), so stopping it is a cancellation, not a
    thread to wake; the hub's `on_change` is safe to call from the loop. SQLAlchemy has no LISTEN
    API, so this is the one place the store talks to psycopg itself; the connection arguments are
    SQLAlchemy's own for the URL (`create_connect_args`), so both connect alike.

    A dropped connection (a restarted or failed-over server, an idle timeout of a proxy) is
    reconnected with exponential backoff. Notifications sent while it was away are lost, and so
    `on_connect` is called after every (re)connect: the hub reads every watched task again
    (`ProgressHub.refresh`). A connection that died without a word (no FIN, a black-holed network)
    is found by a ping after `PING_S` without a notification, and by TCP keepalives."""

    PING_S = 5.0
    BACKOFF_MIN_S = 0.1
    BACKOFF_MAX_S = 5.0

    def __init__(self, db: Database, on_change: Callable[[str], None], on_connect: Callable[[], None]):
        self.db = db
        self.on_change = on_change
        self.on_connect = on_connect
        self.connected = asyncio.Event()  # set while LISTENing (tests wait for it)
        self.connects = 0

    def _connect_args(self) -> tuple[list[Any], dict[str, Any]]:
        engine = self.db.engine
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        cparams = {**cparams, "application_name": "controlplane-changes", "autocommit": True,
                   "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
        return list(cargs), cparams

    async def run(self) -> None:
        """Listen until cancelled, reconnecting whenever the connection is lost."""
        import psycopg

        cargs, cparams = self._connect_args()
        delay = self.BACKOFF_MIN_S
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(*cargs, **cparams)
            except psycopg.Error as e:
                log.warning("change feed: cannot connect (%s); again in %.1fs", type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.BACKOFF_MAX_S)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                    self.connects += 1
                    self.connected.set()
                    delay = self.BACKOFF_MIN_S
                    self.on_connect()  # what was missed while away (or before the first LISTEN)
                    while True:
                        async for note in conn.notifies(timeout=self.PING_S):
                            self.on_change(note.payload)
                        await conn.execute("SELECT 1")  # quiet for PING_S: is the server still there?
            except psycopg.Error as e:
                log.warning("change feed: connection lost (%s); reconnecting in %.1fs", type(e).__name__, delay)
            finally:
                self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.BACKOFF_MAX_S)


def _begin_write(conn: Connection, nonblocking: bool) -> Any:
    """Begin a write transaction on `conn` (BEGIN IMMEDIATE on SQLite: `_install_sqlite_hooks`).
    On a connection that must not wait, another process holding SQLite's write lock is WouldBlock."""
    conn.execution_options(cp_write=True)
    try:
        return conn.begin()
    except OperationalError as e:
        if nonblocking and "locked" in str(e.orig):
            raise WouldBlock() from None
        raise


class likely(ColumnElement[bool]):
    """A condition that holds for most rows it is tried on: SQLite's `likely(x)`, plain `x` on
    other engines. On SQLite it keeps the planner from looking the rows up through an index on the
    condition's column (ix_jobs_state) while still proving the WHERE of a partial index that
    repeats the condition (ix_jobs_watched), which then serves the query's range and order:
    SQLite has no statistics to weigh the two (a test checks the plan)."""

    inherit_cache = True

    def __init__(self, condition: Any):
        self.condition = condition


@compiles(likely)
def _likely(element: likely, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.condition, **kw))


@compiles(likely, "sqlite")
def _likely_sqlite(element: likely, compiler: Any, **kw: Any) -> str:
    return f"likely({compiler.process(element.condition, **kw)})"


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int = 30000) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")  # a committed task survives power loss
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # A savepoint's rollback journal in memory rather than a temporary file: every submit of a
        # group commit runs in a savepoint of its own, and with the journal spilled to a file each
        # one wrote 41 times (99 KiB) where 17 (39 KiB) now do (issue 13). It is only ever read
        # to roll back within a transaction that is still open (crash recovery is the WAL's), so
        # nothing durable depends on it; sorts and temporary tables stay in memory too.
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("cp_write"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

