"""The schema is owned by the alembic migrations, on both engines: every migration upgrades and
downgrades, from an empty database to head and back, and the sqmodel tables match the result."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from controlplane.store import models  # noqa: F401  (registers the tables)
from controlplane.store.db import MIGRATIONS_DIR, Database
from tests.conftest import query_plan


def _config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


SCRIPTS = ScriptDirectory.from_config(_config())
HEAD = SCRIPTS.get_current_head()  # the newest migration
REVISIONS = [s.revision for s in reversed(list(SCRIPTS.walk_revisions()))]  # oldest first
TRIGGERS = {"tasks_queue_depth_insert", "tasks_queue_depth_delete", "tasks_queue_depth_update"}


@pytest.fixture
def db(empty_db_url: str) -> Iterator[Database]:
    """An empty database (no tables at all) on the test's engine."""
    database = Database(empty_db_url)
    yield database
    database.dispose()


def tables(db: Database) -> set[str]:
    return set(inspect(db.engine).get_table_names())


def triggers(db: Database) -> set[str]:
    with db.engine.connect() as c:
        if db.is_sqlite:
            return {r[0] for r in c.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'"))}
        return {r[0] for r in c.execute(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"))}


def index_sql(db: Database, name: str) -> str:
    """An index's definition as the engine keeps it."""
    query = ("SELECT sql FROM sqlite_master WHERE name = :n" if db.is_sqlite else
             "SELECT indexdef FROM pg_indexes WHERE indexname = :n")
    with db.engine.connect() as c:
        return str(c.execute(text(query), {"n": name}).scalar_one())


def test_migrations_create_exactly_the_model_schema(db: Database) -> None:
    db.upgrade()
    assert db.current_revision() == HEAD
    with db.engine.connect() as c, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLite cannot reflect the one expression index (priority DESC)
        diff = compare_metadata(MigrationContext.configure(c), SQLModel.metadata)
    # Neither engine reflects the expression index (priority DESC) so that it compares equal: it
    # is checked by its definition below.
    expression_index = [d for d in diff if d[0] in ("add_index", "remove_index") and d[1].name == "ix_tasks_dispatch"]
    assert [d for d in diff if d not in expression_index] == []
    assert tables(db) >= {"tasks", "task_tags", "task_events", "task_logs", "artifacts", "jobs", "leases",
                          "queue_depth"}
    sql = index_sql(db, "ix_tasks_dispatch")
    if db.is_sqlite:
        assert sql == "CREATE INDEX ix_tasks_dispatch ON tasks (resource_class, state, priority DESC, pk)"
    else:
        assert sql == ("CREATE INDEX ix_tasks_dispatch ON public.tasks USING btree "
                       "(resource_class, state, priority DESC, pk)")
    assert triggers(db) == TRIGGERS  # queue_depth is kept on both engines


def test_every_migration_upgrades_and_downgrades(db: Database) -> None:
    """From empty to head one step at a time, each step undone and redone on the way; then down
    to nothing and up again."""
    cfg = _config(db.url)
    for rev in REVISIONS:
        db.upgrade(rev)
        assert db.current_revision() == rev
        after_up = tables(db), triggers(db)
        command.downgrade(cfg, "-1")
        db.upgrade(rev)
        assert (tables(db), triggers(db)) == after_up, f"{rev} does not downgrade to what it upgraded from"
    db.upgrade()
    db.upgrade()  # a second start changes nothing
    assert db.current_revision() == HEAD
    command.downgrade(cfg, "base")
    assert tables(db) <= {"alembic_version"}
    assert triggers(db) == set()
    if not db.is_sqlite:
        with db.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_proc WHERE proname = 'tasks_queue_depth'")).scalar() == 0
    db.upgrade()
    assert db.current_revision() == HEAD


def insert_task(db: Database, task_id: str, state: str, priority: int = 0) -> None:
    """A task row as the first release wrote it (the columns of 0001)."""
    with db.engine.begin() as c:
        c.execute(text(
            "INSERT INTO tasks (task_id, owner, tool_name, inputs_json, provider, resource_class, priority, ttl_s,"
            " tags_json, resources_json, max_runtime_s, state, attempt, max_attempts, not_before, submitted_at,"
            " updated_at, cancel_requested, log_seq, log_first_seq, version)"
            " VALUES (:id, 'me', 'exercise', '{}', 'local', 'cpu_small', :prio, 60, '[]', '{}', 60, :state,"
            " 1, 1, 0, 1.0, 1.0, false, 0, 1, 3)"), {"id": task_id, "state": state, "prio": priority})


def test_upgrade_from_0001_keeps_tasks_and_gives_them_the_default_store(db: Database) -> None:
    """A database created by the first release upgrades in place, its tasks intact."""
    db.upgrade("0001")
    insert_task(db, "tsk_old", "succeeded")
    db.upgrade()
    assert db.current_revision() == HEAD
    with db.engine.connect() as c:
        row = c.execute(text("SELECT task_id, state, store_url FROM tasks")).one()
    assert tuple(row) == ("tsk_old", "succeeded", "")


def test_tasks_queued_before_the_depths_were_kept_are_counted(db: Database) -> None:
    """Queued tasks already on file when queue_depth started being kept are in it, and the
    triggers keep it from there."""
    db.upgrade("0006")
    for i, (state, prio) in enumerate([("queued", 0), ("queued", 0), ("queued", 5), ("running", 0)]):
        insert_task(db, f"tsk_{i}", state, prio)
    db.upgrade()
    with db.engine.begin() as c:
        c.execute(text("UPDATE tasks SET state = 'scheduled' WHERE task_id = 'tsk_0'"))
        depths = dict(((r[0], r[1]), r[2]) for r in c.execute(text(
            "SELECT resource_class, priority, waiting FROM queue_depth WHERE waiting <> 0")))
    assert depths == {("cpu_small", 0): 1, ("cpu_small", 5): 1}


def test_upgrade_to_0005_renames_dropped_launches_and_records_abandonment(db: Database) -> None:
    """Before 0005 `abandoned` meant a launch intent dropped before anything ran; it is `dropped`
    now, and `abandoned` (with abandoned_at) is a job that never confirmed it stopped."""
    db.upgrade("0004")
    with db.engine.begin() as c:
        for wid, state in (("w1", "abandoned"), ("w2", "done")):
            c.execute(text(
                "INSERT INTO jobs (worker_id, task_id, attempt, provider, resource_class, job_name, state, created_at,"
                " event_seq) VALUES (:w, :t, 1, 'local', 'cpu_small', :j, :s, 1.0, 0)"),
                {"w": wid, "t": f"tsk_{wid}", "j": f"job-{wid}", "s": state})
    db.upgrade()
    with db.engine.connect() as c:
        rows = c.execute(text("SELECT job_id, state, abandoned_at FROM jobs ORDER BY job_id")).all()
    assert [tuple(r) for r in rows] == [("w1", "dropped", None), ("w2", "done", None)]


def test_the_expiry_sweeps_read_the_partial_index_of_ended_tasks(db: Database) -> None:
    """ix_tasks_state_expires takes only tasks with an expires_at (a submitted task has none
    yet), and the expiry sweep and the purge of tombstones still find due tasks along it."""
    from controlplane.store import queries as q

    db.upgrade()
    insert_task(db, "tsk_queued", "queued")
    insert_task(db, "tsk_ended", "succeeded")
    with db.engine.begin() as c:
        c.execute(text("UPDATE tasks SET expires_at = 5.0 WHERE task_id = 'tsk_ended'"))
        c.execute(text("ANALYZE") if db.is_sqlite else text("ANALYZE tasks"))
    sweeps = [(q.DUE_FOR_EXPIRY, {"state": "succeeded", "now": 10.0, "after_ts": 0.0, "after_pk": 0, "lim": 10}),
              (q.DUE_FOR_PURGE, {"before": 10.0, "lim": 10})]
    sql = index_sql(db, "ix_tasks_state_expires")
    assert sql.endswith("WHERE expires_at IS NOT NULL") or sql.endswith("WHERE (expires_at IS NOT NULL)"), sql
    with db.engine.connect() as c:
        if not db.is_sqlite:
            c.execute(text("SET enable_seqscan = off"))  # two rows: make the planner show what it can use
        for stmt, params in sweeps:
            plan = " ".join(query_plan(db, c, stmt, params))
            assert "ix_tasks_state_expires" in plan, plan
    due = db.fetch(q.DUE_FOR_EXPIRY, sweeps[0][1])
    assert [r["task_id"] for r in due] == ["tsk_ended"]
