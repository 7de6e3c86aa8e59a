"""SQL that differs by engine: row locks, upserts and planner hints, each for SQLite and for
PostgreSQL. The store speaks portable SQLAlchemy Core and calls these where engines differ."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement


def for_update(is_sqlite: bool, stmt: Any, *, skip_locked: bool = False) -> Any:
    """Row-lock a SELECT inside a write transaction (no-op on SQLite, which locks the file).
    With `skip_locked`, rows another transaction holds are passed over."""
    return stmt if is_sqlite else stmt.with_for_update(skip_locked=skip_locked)


def for_share(is_sqlite: bool, stmt: Any) -> Any:
    """A SELECT that keeps the rows it read from being changed until the transaction ends
    (FOR SHARE; no-op on SQLite, whose writers are serialised)."""
    return stmt if is_sqlite else stmt.with_for_update(read=True)


def insert_ignore(is_sqlite: bool, table: Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING into `table`."""
    return _insert(is_sqlite)(table).on_conflict_do_nothing()


def upsert(is_sqlite: bool, table: Table, values: dict[str, Any], keys: list[str], where: Any = None,
           set_: dict[str, Any] | None = None) -> Any:
    """INSERT `values`, or on a conflict on `keys` update the other columns to the new values
    (`set_` overrides some with expressions of the row as it was), if `where` holds."""
    stmt = _insert(is_sqlite)(table).values(**values)
    update = {k: stmt.excluded[k] for k in values if k not in keys}
    update.update(set_ or {})
    return stmt.on_conflict_do_update(index_elements=keys, set_=update, where=where)


def _insert(is_sqlite: bool) -> Any:
    if is_sqlite:
        from sqlalchemy.dialects import sqlite
        return sqlite.insert
    from sqlalchemy.dialects import postgresql
    return postgresql.insert


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
