"""The database: the one object the store holds, and the one module that knows which SQL engine
is in use. It composes the parts, each a module of its own:

* `engines`: the engines and their pools (SQLite's pragmas and write lock, PostgreSQL's pools);
* `transactions`: reads, writes, the group commit's write on the event loop, queue locks;
* `statements`: prebuilt statements, run straight through the DB-API driver;
* `schema`: the alembic migrations, applied and checked;
* `changes`: change notifications to other replicas (PostgreSQL's LISTEN/NOTIFY);
* `dialects`: SQL that differs by engine (row locks, upserts, planner hints).

Queue depths are kept by triggers on both engines, written in each engine's SQL (migrations
0007, 0009). Text: PostgreSQL's holds no NUL and enforces varchar lengths, SQLite's keeps
anything; what reaches the store is kept within both where it enters (`api`, the runner's
`events`, `attempts`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import Table
from sqlalchemy.engine import Connection

from controlplane.store import dialects
from controlplane.store.changes import CHANGES_CHANNEL, ChangeFeed, notify_changed
from controlplane.store.dialects import likely
from controlplane.store.engines import IDLE_IN_TRANSACTION_S, CannotOpenDatabase, Engines, engine_url
from controlplane.store.schema import MIGRATIONS_DIR, Schema
from controlplane.store.statements import Build, Statements
from controlplane.store.transactions import LOOP_COMMIT_MAX_S, Transactions

__all__ = ["CHANGES_CHANNEL", "IDLE_IN_TRANSACTION_S", "LOOP_COMMIT_MAX_S", "MIGRATIONS_DIR", "Build",
           "CannotOpenDatabase", "ChangeFeed", "Database", "engine_url", "likely"]

T = TypeVar("T")


class Database:
    """One database (SQLite or PostgreSQL, by its URL). Raises CannotOpenDatabase for a URL that
    names neither; nothing connects until first used. The methods are the parts' (see each)."""

    def __init__(self, url: str, *, echo: bool = False):
        self.engines = engines = Engines(url, echo=echo)
        self.url = engines.url
        self.is_sqlite = engines.is_sqlite
        self.engine = engines.engine
        self.read_engine = engines.read_engine
        self.fetch_engine = engines.fetch_engine
        if self.is_sqlite:
            self.nonblocking_engine = engines.nonblocking_engine
        self.transactions = Transactions(engines)
        self.statements = Statements(engines)
        self.schema = Schema(engines)
        # The hot paths, bound once: a call through the parts costs no extra frame.
        self.fetch = self.statements.fetch
        self.run = self.statements.run
        self.rows = self.statements.rows
        self.count = self.statements.count
        self.run_many = self.statements.run_many
        self.insert_many = self.statements.insert_many
        self.command = self.statements.command
        self._compiled_for = self.statements.compiled_for

    @property
    def commit_s(self) -> float:
        """How long a group commit's commit takes, on average (`write_on_loop`)."""
        return self.transactions.commit_s

    @commit_s.setter
    def commit_s(self, value: float) -> None:
        self.transactions.commit_s = value

    # ---- transactions (`transactions.Transactions`) -------------------------------------------
    def write(self) -> AbstractContextManager[Connection]:
        return self.transactions.write()

    async def write_on_loop(self, fn: Callable[[Connection], T]) -> T:
        return await self.transactions.write_on_loop(fn)

    def read(self) -> Connection:
        return self.transactions.read()

    def lock(self, conn: Connection, *keys: str) -> None:
        """A lock per key held until `conn`'s transaction ends (`Transactions.lock`)."""
        self.transactions.lock(conn, keys)

    # ---- change notifications (`changes`) -----------------------------------------------------
    def notify_changed(self, conn: Connection, task_ids: list[str]) -> None:
        """Announce to other replicas that these tasks changed, inside a write transaction just
        before it commits. No-op on SQLite, whose writers are this process."""
        if not self.is_sqlite:
            notify_changed(conn, task_ids)

    def change_feed(self, on_change: Callable[[str], None], on_connect: Callable[[], None]) -> ChangeFeed | None:
        """What feeds this process's progress hub with changes committed by other processes:
        a `ChangeFeed` on PostgreSQL, None on SQLite (nothing to listen to)."""
        return None if self.is_sqlite else ChangeFeed(self.engines, on_change, on_connect)

    # ---- SQL that differs by engine (`dialects`) ----------------------------------------------
    def for_update(self, stmt: Any, *, skip_locked: bool = False) -> Any:
        return dialects.for_update(self.is_sqlite, stmt, skip_locked=skip_locked)

    def for_share(self, stmt: Any) -> Any:
        return dialects.for_share(self.is_sqlite, stmt)

    def insert_ignore(self, table: Table) -> Any:
        return dialects.insert_ignore(self.is_sqlite, table)

    def upsert(self, table: Table, values: dict[str, Any], keys: list[str], where: Any = None,
               set_: dict[str, Any] | None = None) -> Any:
        return dialects.upsert(self.is_sqlite, table, values, keys, where, set_)

    # ---- schema (`schema.Schema`) -------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        self.schema.upgrade(revision)

    def require_current(self) -> None:
        self.schema.require_current()

    def current_revision(self) -> str | None:
        return self.schema.current_revision()

    def dispose(self) -> None:
        self.engines.dispose()

