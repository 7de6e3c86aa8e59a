"""Inputs by reference: `task_inputs` holds, per file field of a task's inputs, the reference its
caller gave and what admission resolved it to (store, key, size, sha256), indexed by reference so
that retention finds whether an upload is still referred to.

A new table: nothing is copied.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'task_inputs',
        sa.Column('task_id', sa.String(length=40), nullable=False),
        sa.Column('field', sa.String(length=200), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('ref', sa.Text(), nullable=False),
        sa.Column('store_url', sa.Text(), nullable=False),
        sa.Column('storage_key', sa.Text(), nullable=False),
        sa.Column('size_bytes', sa.BigInteger(), nullable=True),
        sa.Column('sha256', sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint('task_id', 'field'),
    )
    op.create_index('ix_task_inputs_ref', 'task_inputs', ['ref', 'task_id'])


def downgrade() -> None:
    op.drop_index('ix_task_inputs_ref', table_name='task_inputs')
    op.drop_table('task_inputs')
