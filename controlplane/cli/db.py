"""`controlplane db upgrade`, and how the other commands open the database: migrated for those
that write, checked to be at the newest revision for those that only read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from controlplane.cli.common import HomeOpt, err, settings_of

app = typer.Typer(no_args_is_help=True, help="Database maintenance.")


@app.command("upgrade")
def db_upgrade(home: HomeOpt = None) -> None:
    """Apply the database migrations (servers also do this when they start, unless
    CONTROLPLANE_MIGRATE_ON_START=false: then this is the deployment's one-shot step)."""
    from controlplane.store.db import CannotOpenDatabase, Database

    settings = settings_of(home)
    settings.ensure_home()
    try:
        db = Database(settings.resolved_database_url)
        db.upgrade()
    except CannotOpenDatabase as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    err.print(f"database at revision {db.current_revision()}")


def open_store(home: Path | None, *, migrate: bool = True) -> Any:
    """The settings and the store of the home's database: migrated to the newest revision for a
    command that writes, checked to be at it for one that only reads (`require_head`)."""
    from controlplane.store import Store
    from controlplane.store.db import Database

    settings = settings_of(home)
    settings.ensure_home()
    db = Database(settings.resolved_database_url)
    if migrate:
        db.upgrade()
    else:
        require_head(db)
    return settings, Store(db)


def require_head(db: Any) -> None:
    """Go on only if the database is at the newest revision this version knows; else exit 2
    saying where it is and what to do. Read-only commands call this instead of migrating: a newer
    CLI pointed at a deployment must not change the schema under its running servers."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import make_url

    from controlplane.store.db import MIGRATIONS_DIR, CannotOpenDatabase

    script = ScriptDirectory(str(MIGRATIONS_DIR))
    head = script.get_current_head()
    file = make_url(db.url).database if db.is_sqlite else None
    try:  # a missing SQLite file is a database never migrated: connecting would create it
        current = None if file and not Path(file).exists() else db.current_revision()
    except CannotOpenDatabase as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if current == head:
        return
    if current is None:
        where = "has no schema yet (never migrated)"
    elif current not in {s.revision for s in script.walk_revisions()}:
        err.print(f"[red]error:[/] the database is at revision {current}, newer than this controlplane knows "
                  f"(it expects {head}): use the version that migrated it", soft_wrap=True)
        raise typer.Exit(2)
    else:
        where = f"is at revision {current}"
    err.print(f"[red]error:[/] the database {where}, this controlplane expects {head}: run `controlplane db "
              "upgrade` first (commands that only read never migrate)", soft_wrap=True)
    raise typer.Exit(2)
