"""Prebuilt statements, run straight through the DB-API driver.

The hot paths (a task by id, a page of logs, submit, transitions) run statements built once at
import: each is compiled once per engine, and only its parameters reach the driver (sqlite3 takes
them by position, psycopg by name). Only plain column types are used (numbers, text, booleans).
Driver errors are raised as SQLAlchemy's (`IntegrityError`, ...), as through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any, cast

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from controlplane.blocking import must_not_block
from controlplane.store.engines import Engines

Build = Callable[[list[str], list[tuple[Any, ...]]], list[Any]]  # (column names, driver tuples) -> rows


class Statements:
    """Runs prebuilt statements on the engines of one database; keeps their compiled forms."""

    def __init__(self, engines: Engines):
        self.engines = engines
        self._dialect = engines.engine.dialect
        self._compiled: dict[Any, tuple[str, list[str] | None, dict[str, Any]]] = {}
        self._keep: list[Any] = []

    def fetch(self, stmt: Any, params: dict[str, Any], *, into: Build | None = None) -> list[Any]:
        """Run a prebuilt SELECT on a read connection: its rows as dicts, or `into(columns,
        tuples)` (a typed row's `many`, which skips the dicts). On PostgreSQL it must not run on
        the event loop (WouldBlock), and a read whose connection was found dead is tried once
        more on a new one."""
        if self.engines.is_sqlite:
            return self._fetch(stmt, params, into)
        must_not_block()
        try:
            return self._fetch(stmt, params, into)
        except DBAPIError as e:
            if not e.connection_invalidated:
                raise
            return self._fetch(stmt, params, into)  # on a new connection: the pool was emptied

    def _fetch(self, stmt: Any, params: dict[str, Any], into: Build | None) -> list[Any]:
        engine = self.engines.fetch_engine
        raw = engine.raw_connection()
        try:
            try:
                rows = self._run(raw.driver_connection, stmt, params, into)
            except DBAPIError as e:
                # SQLAlchemy types `orig` as any exception; here it is always the driver's error
                if not self.engines.is_sqlite and engine.dialect.is_disconnect(
                        e.orig, raw.driver_connection, None):  # type: ignore[arg-type]
                    # The server or a proxy dropped it (a restart, a failover): so were its pool mates.
                    raw.invalidate(e.orig)
                    engine.dispose()
                    e.connection_invalidated = True
                raise
            return cast("list[Any]", rows or [])  # a fetch is a SELECT: its rows, never a count
        finally:
            raw.close()

    def run(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> list[dict[str, Any]] | int:
        """Run a prebuilt statement inside the transaction of `conn` (a `write()` connection).
        Returns the rows of a SELECT (or of RETURNING), else the number of rows affected."""
        return self._run(conn.connection.driver_connection, stmt, params)

    def rows(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        """`run` for a SELECT or a statement with RETURNING: its rows."""
        out = self._run(conn.connection.driver_connection, stmt, params)
        if isinstance(out, int):
            raise TypeError("the statement returned no rows: use `count`")
        return cast("list[dict[str, Any]]", out)

    def count(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> int:
        """`run` for an INSERT, UPDATE or DELETE without RETURNING: the number of rows affected."""
        out = self._run(conn.connection.driver_connection, stmt, params)
        if not isinstance(out, int):
            raise TypeError("the statement returned rows: use `rows`")
        return out

    def command(self, conn: Connection, sql: str) -> None:
        """A statement without parameters or rows (SAVEPOINT, RELEASE ...) inside the transaction
        of `conn`, on the driver."""
        driver: Any = conn.connection.driver_connection
        cur = driver.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()

    def run_many(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> None:
        """Run a prebuilt statement once for each of `rows` (parameter sets with the same keys)
        inside the transaction of `conn`, in one executemany."""
        if not rows:
            return
        sql, names, fixed = self.compiled_for(stmt, rows[0])
        if names is not None and not fixed and len(names) > 1:  # (itemgetter: a tuple per row, in C)
            args: Any = list(map(itemgetter(*names), rows))
        elif names is not None:
            args = [[r[n] if n in r else fixed[n] for n in names] for r in rows]
        else:
            args = [{**fixed, **r} for r in rows] if fixed else rows
        dbapi_error = self._dialect.loaded_dbapi.Error
        driver: Any = conn.connection.driver_connection
        cur = driver.cursor()
        try:
            cur.executemany(sql, args)
        except dbapi_error as e:
            raise DBAPIError.instance(sql, args[:1], e, dbapi_error) from e
        finally:
            cur.close()

    def insert_many(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> None:
        """Insert `rows` (dicts with the same keys) with the INSERT `stmt` inside the transaction of
        `conn`: one executemany on SQLite; on PostgreSQL one COPY, whose rows travel as one stream
        (an executemany there is a round of protocol messages per row: thousands of rows, a
        sweep's shards, took seconds)."""
        if not rows:
            return
        if self._dialect.name != "postgresql":
            self.run_many(conn, stmt, rows)
            return
        columns = list(rows[0])
        names = ", ".join(f'"{c}"' for c in columns)
        driver: Any = conn.connection.driver_connection
        dbapi_error = self._dialect.loaded_dbapi.Error
        sql = f'COPY "{stmt.table.name}" ({names}) FROM STDIN'
        try:
            with driver.cursor() as cur, cur.copy(sql) as copy:
                for row in rows:
                    copy.write_row([row[c] for c in columns])
        except dbapi_error as e:
            raise DBAPIError.instance(sql, [], e, dbapi_error) from e

    def _run(self, dbapi_conn: Any, stmt: Any, params: dict[str, Any],
             into: Build | None = None) -> list[Any] | int:
        sql, names, fixed = self.compiled_for(stmt, params)
        merged = {**fixed, **params}  # literals in the statement are bound parameters too
        args: Any = [merged[n] for n in names] if names is not None else merged
        dbapi_error = self._dialect.loaded_dbapi.Error
        cur = dbapi_conn.cursor()
        try:
            cur.execute(sql, args)
            if cur.description is None:
                affected: int = cur.rowcount
                return affected
            cols = [d[0] for d in cur.description]
            if into is not None:
                return into(cols, cur.fetchall())
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        except dbapi_error as e:  # the same exceptions SQLAlchemy raises (IntegrityError, ...)
            raise DBAPIError.instance(sql, args, e, dbapi_error) from e
        finally:
            cur.close()

    def compiled_for(self, stmt: Any, params: dict[str, Any]) -> tuple[str, list[str] | None, dict[str, Any]]:
        """The SQL of `stmt` for this engine, the parameter names in the driver's order (None
        when the driver takes them by name), and the statement's own literal parameters."""
        # INSERT and UPDATE compile to different SQL for different sets of columns.
        dml = stmt.is_dml
        key = (id(stmt), tuple(sorted(params))) if dml else id(stmt)
        entry = self._compiled.get(key)
        if entry is None:
            table_cols = set(stmt.table.c.keys()) if dml else set()
            compiled = stmt.compile(dialect=self._dialect,
                                    column_keys=[k for k in params if k in table_cols] if dml else None)
            fixed = {k: v for k, v in compiled.params.items() if v is not None and k not in params}
            entry = (str(compiled), list(compiled.positiontup) if compiled.positional else None, fixed)
            self._compiled[key] = entry
            self._keep.append(stmt)  # keeps ids unique while the cache refers to them
        return entry
