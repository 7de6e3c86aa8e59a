"""Limits per caller: operators' overrides, and the streaming waits open now.

* `caller_limits`: per-caller overrides of the limits in the settings (`controlplane limits`);
  a NULL column keeps the default, -1 lifts the limit for that caller, 0 allows none.
* `caller_streams`: the streaming waits open now (wait_task, tasks/result), one row each, so
  that every replica on the database counts them alike; a row outlives a server that died only
  until its `expires_at` (the wait's own timeout plus a margin, or a renewed lease).

Submits per minute and per day and tasks in flight are counted from `tasks` itself
(ix_tasks_owner, ix_tasks_owner_state), so they need no table.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'caller_limits',
        sa.Column('owner', sa.String(length=200), primary_key=True),
        sa.Column('submits_per_minute', sa.Integer(), nullable=True),
        sa.Column('submits_per_day', sa.Integer(), nullable=True),
        sa.Column('tasks_in_flight', sa.Integer(), nullable=True),
        sa.Column('streams', sa.Integer(), nullable=True),
        sa.Column('updated_at', sa.Float(), nullable=False),
    )
    op.create_table(
        'caller_streams',
        sa.Column('stream_id', sa.String(length=40), primary_key=True),
        sa.Column('owner', sa.String(length=200), nullable=False),
        sa.Column('task_id', sa.String(length=40), nullable=False),
        sa.Column('started_at', sa.Float(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
    )
    op.create_index('ix_caller_streams_owner', 'caller_streams', ['owner', 'expires_at'])


def downgrade() -> None:
    op.drop_index('ix_caller_streams_owner', table_name='caller_streams')
    op.drop_table('caller_streams')
    op.drop_table('caller_limits')
