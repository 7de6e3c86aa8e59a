"""Each task records the object store that holds its inputs, results and artifacts.

A store is chosen per catalog entry (or resource class), so one server can keep tasks in
several stores; expiry and result links need to know which. Existing tasks keep '' (the
server's default store).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('store_url', sa.Text(), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_column('store_url')
