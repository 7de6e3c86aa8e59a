"""The team a task is shared with.

`tasks.team`: the team (a claim of the submitter's OAuth token, `CONTROLPLANE_AUTH_TEAM_CLAIM`)
whose members may read the task; NULL for a task shared with nobody. Nothing is indexed by it:
a task is read by id and listed by owner, and the team only filters what those find.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default: ALTER TABLE ADD COLUMN on both engines (no rebuild of
    # the table, so SQLite's queue_depth triggers stay as they are).
    op.add_column('tasks', sa.Column('team', sa.String(length=200), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ and PostgreSQL drop a column in place (no rebuild: the triggers stay).
    op.execute("ALTER TABLE tasks DROP COLUMN team")
