"""Jobs that never confirmed they stopped are recorded as abandoned, with when.

A cancelled or silent job that does not confirm it stopped within stop_confirm_timeout_s no
longer holds its task: the task ends and the job is `abandoned` (still watched, and stopped now and
then, until the provider says it ended; then `done`, `abandoned_at` kept for the operator). The
state that used to be called `abandoned`, a launch intent dropped before anything was launched,
is now `dropped`.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('abandoned_at', sa.Float(), nullable=True))
    op.execute("UPDATE jobs SET state = 'dropped' WHERE state = 'abandoned'")


def downgrade() -> None:
    op.execute("UPDATE jobs SET state = 'done' WHERE state = 'abandoned'")
    op.execute("UPDATE jobs SET state = 'abandoned' WHERE state = 'dropped'")
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('abandoned_at')
