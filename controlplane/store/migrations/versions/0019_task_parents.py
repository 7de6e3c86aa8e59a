"""Tasks that wait for others: `task_parents` holds, per task submitted with `after`, one row per
parent it waits for, and is indexed by parent so that a parent's end finds its children.

A new table and a new state value (`waiting`, in the existing text column): nothing is copied.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'task_parents',
        sa.Column('child_id', sa.String(length=40), nullable=False),
        sa.Column('parent_id', sa.String(length=40), nullable=False),
        sa.PrimaryKeyConstraint('child_id', 'parent_id'),
    )
    op.create_index('ix_task_parents_parent', 'task_parents', ['parent_id', 'child_id'])


def downgrade() -> None:
    op.drop_index('ix_task_parents_parent', table_name='task_parents')
    op.drop_table('task_parents')
