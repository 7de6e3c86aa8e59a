"""A folded list at a constant cost: `ix_tasks_owner_plain` (and its twins by state and by tool)
holds an owner's tasks of no sweep (no shard), so that a list taking each sweep as one row walks
them without passing a sweep's shards, and `ix_tasks_sweep_state` gains the shard, so that a
sweep's lowest shard in a state is one probe on both engines (PostgreSQL's index does not end
with the row's key as SQLite's does).

Indexes only: nothing is copied. Building them reads the tasks table once.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

PLAIN = "sweep_id IS NULL"
IN_SWEEP = "sweep_id IS NOT NULL"


def upgrade() -> None:
    op.create_index('ix_tasks_owner_plain', 'tasks', ['owner', 'submitted_at', 'pk'],
                    sqlite_where=sa.text(PLAIN), postgresql_where=sa.text(PLAIN))
    op.create_index('ix_tasks_owner_state_plain', 'tasks', ['owner', 'state', 'submitted_at', 'pk'],
                    sqlite_where=sa.text(PLAIN), postgresql_where=sa.text(PLAIN))
    op.create_index('ix_tasks_owner_tool_plain', 'tasks', ['owner', 'tool_name', 'submitted_at', 'pk'],
                    sqlite_where=sa.text(PLAIN), postgresql_where=sa.text(PLAIN))
    op.drop_index('ix_tasks_sweep_state', table_name='tasks')
    op.create_index('ix_tasks_sweep_state', 'tasks', ['sweep_id', 'state', 'shard'],
                    sqlite_where=sa.text(IN_SWEEP), postgresql_where=sa.text(IN_SWEEP))


def downgrade() -> None:
    op.drop_index('ix_tasks_sweep_state', table_name='tasks')
    op.create_index('ix_tasks_sweep_state', 'tasks', ['sweep_id', 'state'],
                    sqlite_where=sa.text(IN_SWEEP), postgresql_where=sa.text(IN_SWEEP))
    op.drop_index('ix_tasks_owner_tool_plain', table_name='tasks')
    op.drop_index('ix_tasks_owner_state_plain', table_name='tasks')
    op.drop_index('ix_tasks_owner_plain', table_name='tasks')
