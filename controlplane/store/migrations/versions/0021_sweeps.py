"""Sweeps: `sweeps` holds one row per sweep (one submit of many tasks of one tool: its base inputs,
how they vary, its limits and failure policy); `tasks` gains `sweep_id` and `shard` (its 0-based
index), indexed only where set, so that ordinary tasks pay nothing for them.

A new table and two nullable columns: nothing is copied.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

IN_SWEEP = "sweep_id IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        'sweeps',
        sa.Column('pk', sa.Integer(), nullable=False),
        sa.Column('sweep_id', sa.String(length=40), nullable=False),
        sa.Column('owner', sa.String(length=200), nullable=False),
        sa.Column('team', sa.String(length=200), nullable=True),
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('resource_class', sa.String(length=64), nullable=False),
        sa.Column('base_inputs_json', sa.Text(), nullable=False),
        sa.Column('vary_json', sa.Text(), nullable=False),
        sa.Column('shards', sa.Integer(), nullable=False),
        sa.Column('max_parallel', sa.Integer(), nullable=True),
        sa.Column('fail_fast', sa.Integer(), nullable=True),
        sa.Column('priority', sa.Integer(), nullable=False),
        sa.Column('tags_json', sa.Text(), nullable=False),
        sa.Column('idempotency_key', sa.String(length=200), nullable=True),
        sa.Column('estimate_s', sa.Float(), nullable=True),
        sa.Column('estimate_cost', sa.Float(), nullable=True),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('stopped_at', sa.Float(), nullable=True),
        sa.Column('stop_reason', sa.String(length=500), nullable=True),
        sa.PrimaryKeyConstraint('pk'),
        sa.UniqueConstraint('sweep_id'),
        sa.UniqueConstraint('owner', 'tool_name', 'idempotency_key', name='uq_sweeps_idempotency'),
    )
    op.create_index('ix_sweeps_owner', 'sweeps', ['owner', 'created_at', 'pk'])
    # Nullable columns without a default: ALTER TABLE ADD COLUMN on both engines (no rebuild of
    # the table, so SQLite's queue_depth triggers stay as they are).
    op.add_column('tasks', sa.Column('sweep_id', sa.String(length=40), nullable=True))
    op.add_column('tasks', sa.Column('shard', sa.Integer(), nullable=True))
    op.create_index('ix_tasks_sweep_shard', 'tasks', ['sweep_id', 'shard'], unique=True,
                    sqlite_where=sa.text(IN_SWEEP), postgresql_where=sa.text(IN_SWEEP))
    op.create_index('ix_tasks_sweep_state', 'tasks', ['sweep_id', 'state'],
                    sqlite_where=sa.text(IN_SWEEP), postgresql_where=sa.text(IN_SWEEP))


def downgrade() -> None:
    op.drop_index('ix_tasks_sweep_state', table_name='tasks')
    op.drop_index('ix_tasks_sweep_shard', table_name='tasks')
    # Dropped in place on SQLite 3.35+ and PostgreSQL (no rebuild: the triggers stay).
    op.execute("ALTER TABLE tasks DROP COLUMN shard")
    op.execute("ALTER TABLE tasks DROP COLUMN sweep_id")
    op.drop_index('ix_sweeps_owner', table_name='sweeps')
    op.drop_table('sweeps')
