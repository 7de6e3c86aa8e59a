"""Queue depths kept by triggers: admission reads them instead of counting the queue.

`queue_depth` holds, per (resource class, priority), how many tasks are in state `queued`. On
SQLite three triggers on `tasks` keep it exact whatever writes the row (a submit, a transition,
a purge, a bulk insert): one after an insert of a queued task, one after a delete of one, one
after an update that moves a task into or out of `queued` (or moves a queued task to another
class or priority). The table starts from a count of the queued tasks already there.

On PostgreSQL the table is created but not kept (no triggers yet): admission there still counts
the queue (`Database.queue_admission`); the PostgreSQL work brings its own triggers.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_ADD = ("INSERT INTO queue_depth (resource_class, priority, waiting) SELECT {t}.resource_class, {t}.priority, 1 "
        "WHERE {t}.state = 'queued' "
        "ON CONFLICT (resource_class, priority) DO UPDATE SET waiting = queue_depth.waiting + 1;")
_SUB = ("UPDATE queue_depth SET waiting = waiting - 1 WHERE {t}.state = 'queued' "
        "AND resource_class = {t}.resource_class AND priority = {t}.priority;")

SQLITE_TRIGGERS = {
    "tasks_queue_depth_insert": f"AFTER INSERT ON tasks WHEN NEW.state = 'queued' BEGIN {_ADD.format(t='NEW')} END",
    "tasks_queue_depth_delete": f"AFTER DELETE ON tasks WHEN OLD.state = 'queued' BEGIN {_SUB.format(t='OLD')} END",
    "tasks_queue_depth_update": (
        "AFTER UPDATE OF state, resource_class, priority ON tasks "
        "WHEN OLD.state = 'queued' OR NEW.state = 'queued' "
        f"BEGIN {_SUB.format(t='OLD')} {_ADD.format(t='NEW')} END"),
}


def upgrade() -> None:
    op.create_table(
        'queue_depth',
        sa.Column('resource_class', sa.String(length=64), nullable=False),
        sa.Column('priority', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('waiting', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('resource_class', 'priority'),
    )
    op.execute("INSERT INTO queue_depth (resource_class, priority, waiting) "
               "SELECT resource_class, priority, count(*) FROM tasks WHERE state = 'queued' "
               "GROUP BY resource_class, priority")
    if op.get_bind().dialect.name == 'sqlite':
        for name, body in SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table('queue_depth')
