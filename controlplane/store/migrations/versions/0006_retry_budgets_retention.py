"""Separate retry budgets, and an index for purging the audit.

A task counts apart the attempts its tool failed (`failures`, against `max_attempts`) and the
attempts lost, preempted or never launched (`recoveries`, against `max_recoveries`). Existing
tasks get `max_recoveries = max_attempts - 1`, the budget they had when both kinds shared one.
`task_events.ts` is indexed so that events older than the audit period are found without a scan.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('failures', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('recoveries', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('max_recoveries', sa.Integer(), nullable=False, server_default='0'))
    op.execute("UPDATE tasks SET max_recoveries = max_attempts - 1")
    op.create_index('ix_task_events_ts', 'task_events', ['ts'])


def downgrade() -> None:
    op.drop_index('ix_task_events_ts', table_name='task_events')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_column('max_recoveries')
        batch_op.drop_column('recoveries')
        batch_op.drop_column('failures')
