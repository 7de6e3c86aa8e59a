"""The database's schema: the alembic migrations under `migrations/`, applied and checked."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from controlplane.store.engines import CannotOpenDatabase, Engines

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 7245531  # PostgreSQL advisory lock held while migrating


class Schema:
    """Migrates and inspects the schema of one database. Every method blocks, and raises
    CannotOpenDatabase when the database cannot be opened."""

    def __init__(self, engines: Engines):
        self.engines = engines

    def upgrade(self, revision: str = "head") -> None:
        """Apply the alembic migrations. Safe when several processes start at once: SQLite runs
        them inside one IMMEDIATE transaction, PostgreSQL under an advisory lock."""
        with _quiet_alembic():
            from alembic import command

            cfg = _alembic_config()
            cfg.set_main_option("sqlalchemy.url", self.engines.url.replace("%", "%%"))
            with self.engines.connect() as conn:
                conn.execution_options(cp_write=True)
                with conn.begin():
                    if not self.engines.is_sqlite:
                        conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, revision)

    def require_current(self) -> None:
        """CannotOpenDatabase unless the schema is at the newest migration this code has (for
        servers that do not migrate on start: `controlplane db upgrade` is their one-shot)."""
        with _quiet_alembic():
            from alembic.script import ScriptDirectory

            head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
            current = self.current_revision()
        if current != head:
            raise CannotOpenDatabase(f"the database is at revision {current or '(none)'}, this server needs {head}: "
                                     "run `controlplane db upgrade` first (CONTROLPLANE_MIGRATE_ON_START is off)")

    def current_revision(self) -> str | None:
        """The revision the database's schema is at; None before the first migration."""
        with _quiet_alembic():
            from alembic.runtime.migration import MigrationContext

            with self.engines.connect() as conn:
                return MigrationContext.configure(conn).get_current_revision()


def _alembic_config() -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


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
