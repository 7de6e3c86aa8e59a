"""The `controlplane` commands that only read the database (`jobs`, `limits list`, `budgets list`,
`usage`) never migrate it: a newer CLI pointed at a deployment would otherwise change the schema
under its running servers. Behind the newest revision, or never migrated, they change nothing and
say to run `controlplane db upgrade`; at it, they answer. The real CLI, on both engines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from controlplane.store.db import MIGRATIONS_DIR, Database
from tests.test_cli import controlplane, ok, user_env

SCRIPTS = ScriptDirectory(str(MIGRATIONS_DIR))
HEAD = SCRIPTS.get_current_head()
OLDER = next(s.down_revision for s in SCRIPTS.walk_revisions() if s.revision == HEAD)
READERS = (["jobs", "--json"], ["limits", "list", "--json"], ["budgets", "list", "--json"], ["usage", "--json"])


def run(home: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return controlplane(*args, "--home", str(home), env=user_env(CONTROLPLANE_DATABASE_URL=url))


def refused(done: subprocess.CompletedProcess[str], *said: str) -> None:
    """Exit 2 with one line on stderr that says all of `said`, and nothing on stdout."""
    assert done.returncode == 2, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(s in lines[0] for s in said), done.stderr
    assert not done.stdout and "Traceback" not in done.stderr


def revision(url: str) -> str | None:
    db = Database(url)
    try:
        return db.current_revision()
    finally:
        db.dispose()


def test_read_only_commands_leave_an_older_database_at_its_revision(home: Path, empty_db_url: str) -> None:
    db = Database(empty_db_url)
    db.upgrade(OLDER)
    db.dispose()
    for command in READERS:
        refused(run(home, empty_db_url, *command),
                f"the database is at revision {OLDER}, this controlplane expects {HEAD}", "`controlplane db upgrade`")
        assert revision(empty_db_url) == OLDER, f"{' '.join(command)} migrated the database"
    # A command that writes migrates as before, and then the readers answer.
    ok(run(home, empty_db_url, "limits", "set", "alice", "--streams", "3"))
    assert revision(empty_db_url) == HEAD
    limits = json.loads(ok(run(home, empty_db_url, "limits", "list", "--json")))
    assert [(c["owner"], c["streams"]) for c in limits["callers"]] == [("alice", 3)]
    assert json.loads(ok(run(home, empty_db_url, "jobs", "--json"))) == []
    assert json.loads(ok(run(home, empty_db_url, "budgets", "list", "--json")))["budgets"] == []
    usage = json.loads(ok(run(home, empty_db_url, "usage", "--json")))
    assert usage["groups"] == [] and usage["group_by"] == ["tool"]


def test_read_only_commands_do_not_create_a_schema(home: Path, engine: str, empty_db_url: str) -> None:
    for command in READERS:
        refused(run(home, empty_db_url, *command), "the database has no schema yet (never migrated)",
                f"expects {HEAD}", "`controlplane db upgrade`")
    if engine == "sqlite":
        assert not Path(empty_db_url.removeprefix("sqlite:///")).exists()
    else:
        db = Database(empty_db_url)
        assert inspect(db.engine).get_table_names() == []
        db.dispose()
    ok(run(home, empty_db_url, "db", "upgrade"))
    assert json.loads(ok(run(home, empty_db_url, "jobs", "--json"))) == []


def test_a_database_newer_than_the_cli_is_named(home: Path, empty_db_url: str) -> None:
    db = Database(empty_db_url)
    db.upgrade()
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    db.dispose()
    refused(run(home, empty_db_url, "jobs"), "at revision 9999, newer than this controlplane knows",
            f"expects {HEAD}")
    assert revision(empty_db_url) == "9999"


def test_an_unreachable_database_is_named_without_its_password(tmp_path: Path) -> None:
    done = run(tmp_path / "home", "postgresql://cp:s3cret@127.0.0.1:9/nowhere", "limits", "list")
    refused(done, "cannot open the database postgresql://cp:***@127.0.0.1:9/nowhere", "refused")
    assert "s3cret" not in done.stderr
