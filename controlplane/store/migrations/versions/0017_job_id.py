"""`worker_id` becomes `job_id`, in jobs (its key) and in tasks (the current attempt's job).

The column always held a provider job's id; nothing in the system is a worker. Both engines
rename a column in place (SQLite since 3.25) and carry its indexes along, so the upgrade copies
no rows. Replicas of an earlier release read the old name: run them no longer than the upgrade.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs RENAME COLUMN worker_id TO job_id")
    op.execute("ALTER TABLE tasks RENAME COLUMN worker_id TO job_id")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks RENAME COLUMN job_id TO worker_id")
    op.execute("ALTER TABLE jobs RENAME COLUMN job_id TO worker_id")
