"""The placement an attempt runs on, on its job.

A tool may list several placements (a provider with its options each). Which one an attempt's
job runs on is chosen when the attempt is claimed and kept beside the job's provider: `placement`
is its index in the tool's list as the task was admitted under. Rows already there ran on the
tool's only placement: 0.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('placement', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('placement')
