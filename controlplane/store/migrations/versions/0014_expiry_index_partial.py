"""The expiry index holds only the tasks that can expire.

`ix_tasks_state_expires` served the expiry sweep and the purge of tombstones, which both look
for tasks whose `expires_at` has passed. Only an ended task has one; yet every task was in the
index from its submit on, so each submit wrote an index entry nobody reads (about two of the
thirty pages a group commit of seven submits writes), and the index held every queued
and running task besides. Partial now, `WHERE expires_at IS NOT NULL`: a task enters it when it
ends. Both engines use it for those queries, whose `expires_at <= ...` implies the condition
(`tests/test_migrations.py` checks the plans). The index is rebuilt in place; nothing else
changes.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

ENDED = "expires_at IS NOT NULL"  # models.EXPIRES_WHERE, as it was written here


def upgrade() -> None:
    op.drop_index('ix_tasks_state_expires', table_name='tasks')
    op.create_index('ix_tasks_state_expires', 'tasks', ['state', 'expires_at'], sqlite_where=sa.text(ENDED),
                    postgresql_where=sa.text(ENDED))


def downgrade() -> None:
    op.drop_index('ix_tasks_state_expires', table_name='tasks')
    op.create_index('ix_tasks_state_expires', 'tasks', ['state', 'expires_at'])
