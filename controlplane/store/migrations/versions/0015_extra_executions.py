"""Extra executions of an attempt: what the operator sees of them.

A second execution of one attempt (a paused leader launching again, a retried launch whose
first try did start, a cloud's own retry) has its claim refused by the control plane. Three
counters on the attempt's job: `extra_claims` (refused claims seen), `extra_checked` (those the
reconciler has looked into: it stops every execution of the attempt that is not the job's own)
and `extra_stopped` (executions it stopped). Rows already there start at 0.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

COLUMNS = ('extra_claims', 'extra_checked', 'extra_stopped')


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
