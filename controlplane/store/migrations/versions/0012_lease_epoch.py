"""Lease epochs: a fencing token for the leader's writes.

`leases.epoch` goes up by one at each takeover of a lease. The leader's writes that must not
happen twice (claiming queued work, recording a launch) check that the lease is still theirs in
the epoch they took it in, so a leader that was paused past its lease and wakes changes nothing
(`controlplane/store/leases.py`). Rows already there start at 0; the next takeover makes it 1.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('leases') as batch:
        batch.add_column(sa.Column('epoch', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('leases') as batch:
        batch.drop_column('epoch')
