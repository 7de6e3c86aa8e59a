"""Queue depths kept by triggers on PostgreSQL too.

Migration 0007 keeps `queue_depth` with SQLite triggers; here PostgreSQL gets the same three
triggers (same names, same conditions), all calling one plpgsql function: after an insert of a
queued task, after a delete of one, and after an update of state, resource_class or priority
that moves a task into or out of `queued` (or moves a queued task to another class or
priority). The table is recounted from the queued tasks, so that whatever happened to it while
nothing kept it is forgotten. SQLite is left as 0007 made it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

FUNCTION = """
CREATE FUNCTION tasks_queue_depth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF OLD.state = 'queued' THEN
            UPDATE queue_depth SET waiting = waiting - 1
             WHERE resource_class = OLD.resource_class AND priority = OLD.priority;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.state = 'queued' THEN
            INSERT INTO queue_depth (resource_class, priority, waiting) VALUES (NEW.resource_class, NEW.priority, 1)
            ON CONFLICT (resource_class, priority) DO UPDATE SET waiting = queue_depth.waiting + 1;
        END IF;
    END IF;
    RETURN NULL;
END
$$
"""

POSTGRES_TRIGGERS = {
    "tasks_queue_depth_insert": "AFTER INSERT ON tasks FOR EACH ROW WHEN (NEW.state = 'queued')",
    "tasks_queue_depth_delete": "AFTER DELETE ON tasks FOR EACH ROW WHEN (OLD.state = 'queued')",
    "tasks_queue_depth_update": ("AFTER UPDATE OF state, resource_class, priority ON tasks FOR EACH ROW "
                                 "WHEN (OLD.state = 'queued' OR NEW.state = 'queued')"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    # No task is written from here to the commit, so that no change falls between the triggers
    # and the count the table starts from (nothing kept it before).
    op.execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
    op.execute(FUNCTION)
    for name, when in POSTGRES_TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {when} EXECUTE FUNCTION tasks_queue_depth()")
    op.execute("DELETE FROM queue_depth")
    op.execute("INSERT INTO queue_depth (resource_class, priority, waiting) "
               "SELECT resource_class, priority, count(*) FROM tasks WHERE state = 'queued' "
               "GROUP BY resource_class, priority")


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    for name in POSTGRES_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON tasks")
    op.execute("DROP FUNCTION IF EXISTS tasks_queue_depth()")
