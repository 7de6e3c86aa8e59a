"""Jobs record the claim of their runner secret (a digest of the claiming runner's nonce).

The job's spec carries only a bootstrap token, which the runner trades once for the attempt's
callback secret; the claim is kept so that a token read later from the cloud's API is dead.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('secret_claim', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('secret_claim')
