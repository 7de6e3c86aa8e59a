"""A sweep's stop once finished: `sweeps.stop_done_at` records when a stopped sweep had no shard
left to end (no shard returns to a state a stop ends, so it stays done), and
`ix_sweeps_stop_left` holds only the stops not yet done, so that the reconciler's look for what
stops left reads none of the finished ones.

A nullable column: nothing is copied. Sweeps stopped before it are looked at once by the
reconciler, which marks those it finds done.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

STOP_LEFT = "stopped_at IS NOT NULL AND stop_done_at IS NULL"


def upgrade() -> None:
    op.add_column('sweeps', sa.Column('stop_done_at', sa.Float(), nullable=True))
    op.create_index('ix_sweeps_stop_left', 'sweeps', ['stopped_at'],
                    sqlite_where=sa.text(STOP_LEFT), postgresql_where=sa.text(STOP_LEFT))


def downgrade() -> None:
    op.drop_index('ix_sweeps_stop_left', table_name='sweeps')
    op.execute("ALTER TABLE sweeps DROP COLUMN stop_done_at")
