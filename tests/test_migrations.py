"""The schema is owned by the alembic migrations, and the sqlmodel tables match them."""

from __future__ import annotations

import warnings
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlmodel import SQLModel

from controlplane.store import models  # noqa: F401  (registers the tables)
from controlplane.store.db import MIGRATIONS_DIR, Database


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(cfg).get_current_head()


HEAD = _head()  # the newest migration


def test_migrations_create_exactly_the_model_schema(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'cp.db'}")
    db.upgrade()
    assert db.current_revision() == HEAD
    with db.engine.connect() as c, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLite cannot reflect the one expression index (priority DESC)
        diff = compare_metadata(MigrationContext.configure(c), SQLModel.metadata)
    # SQLite cannot reflect the expression index (priority DESC): it is checked by its SQL below.
    expression_index = [d for d in diff if d[0] in ("add_index", "remove_index") and d[1].name == "ix_tasks_dispatch"]
    assert [d for d in diff if d not in expression_index] == []
    names = set(inspect(db.engine).get_table_names())
    assert names >= {"tasks", "task_tags", "task_events", "task_logs", "artifacts", "jobs", "leases"}
    with db.engine.connect() as c:
        sql = c.exec_driver_sql("select sql from sqlite_master where name = 'ix_tasks_dispatch'").scalar_one()
    assert sql == "CREATE INDEX ix_tasks_dispatch ON tasks (resource_class, state, priority DESC, pk)"


def test_upgrade_is_idempotent_and_downgrade_clean(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'cp.db'}")
    db.upgrade()
    db.upgrade()  # a second start changes nothing
    assert db.current_revision() == HEAD
    from alembic import command
    from alembic.config import Config

    from controlplane.store.db import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", db.url)
    command.downgrade(cfg, "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    db.upgrade()
    assert db.current_revision() == HEAD


def test_upgrade_from_0001_keeps_tasks_and_gives_them_the_default_store(tmp_path: Path) -> None:
    """A database created by the first release upgrades in place, its tasks intact."""
    db = Database(f"sqlite:///{tmp_path / 'cp.db'}")
    db.upgrade("0001")
    with db.engine.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO tasks (task_id, owner, tool_name, inputs_json, provider, resource_class, priority, ttl_s,"
            " tags_json, resources_json, max_runtime_s, state, attempt, max_attempts, not_before, submitted_at,"
            " updated_at, cancel_requested, log_seq, log_first_seq, version)"
            " VALUES ('tsk_old', 'me', 'exercise', '{}', 'local', 'cpu_small', 0, 60, '[]', '{}', 60, 'succeeded',"
            " 1, 1, 0, 1.0, 1.0, 0, 0, 1, 3)")
    db.upgrade()
    assert db.current_revision() == HEAD
    with db.engine.connect() as c:
        row = c.exec_driver_sql("SELECT task_id, state, store_url FROM tasks").one()
    assert tuple(row) == ("tsk_old", "succeeded", "")


def test_upgrade_to_0005_renames_dropped_launches_and_records_abandonment(tmp_path: Path) -> None:
    """Before 0005 `abandoned` meant a launch intent dropped before anything ran; it is `dropped`
    now, and `abandoned` (with abandoned_at) is a job that never confirmed it stopped."""
    db = Database(f"sqlite:///{tmp_path / 'cp.db'}")
    db.upgrade("0004")
    with db.engine.begin() as c:
        for wid, state in (("w1", "abandoned"), ("w2", "done")):
            c.exec_driver_sql(
                "INSERT INTO jobs (worker_id, task_id, attempt, provider, resource_class, job_name, state, created_at,"
                f" event_seq) VALUES ('{wid}', 'tsk_{wid}', 1, 'local', 'cpu_small', 'job-{wid}', '{state}', 1.0, 0)")
    db.upgrade()
    with db.engine.connect() as c:
        rows = c.exec_driver_sql("SELECT worker_id, state, abandoned_at FROM jobs ORDER BY worker_id").all()
    assert [tuple(r) for r in rows] == [("w1", "dropped", None), ("w2", "done", None)]
