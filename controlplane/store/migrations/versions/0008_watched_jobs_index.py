"""An index of the watched jobs alone, for the reconciler's paged walk.

The reconciler reads the jobs it watches (active, draining, abandoned) a page at a time, in
(created_at, worker_id) order from a cursor, so that a cycle's memory is bounded by a page rather
than by the number of jobs in flight. A partial index holding only those jobs makes each page one
index range, however many finished jobs the table keeps.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

WATCHED = "state IN ('abandoned', 'active', 'draining')"  # models.WATCHED_JOBS_WHERE, as it was written here


def upgrade() -> None:
    op.create_index('ix_jobs_watched', 'jobs', ['created_at', 'worker_id'], sqlite_where=sa.text(WATCHED),
                    postgresql_where=sa.text(WATCHED))


def downgrade() -> None:
    op.drop_index('ix_jobs_watched', table_name='jobs')
