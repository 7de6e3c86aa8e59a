"""Releasing many waiting children in bounded batches: `task_releases` holds, per ended (or
cascade-cancelled) task whose waiting children were more than one transaction settles, where
the reconciler continues (the last child settled) and, for a cascading cancel, the error its
descendants end with.

A new table: nothing is copied.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'task_releases',
        sa.Column('parent_id', sa.String(length=40), nullable=False),
        sa.Column('after_id', sa.String(length=40), nullable=False),
        sa.Column('ancestor', sa.String(length=40), nullable=True),
        sa.Column('cascade_json', sa.Text(), nullable=True),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('parent_id'),
    )


def downgrade() -> None:
    op.drop_table('task_releases')
