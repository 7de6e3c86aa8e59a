"""Cost and usage: what each attempt used, budgets, and each task's estimated cost.

* `attempt_usage`: one row per attempt that ran, written with its end: run time, shape, vCPU-,
  GiB- and GPU-seconds, and the estimated cost at the prices of that moment (`controlplane.prices`);
  read by get_task_status / get_task_result, usage_report and the budgets.
* `budgets`: operators' budgets per caller or per tag and calendar period (`controlplane budgets`).
* `tasks.estimate_cost`: what the submit estimated; budgets count it while the task runs. A
  nullable column added in place (no rebuild: SQLite's queue_depth triggers stay as they are).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tasks', sa.Column('estimate_cost', sa.Float(), nullable=True))
    op.create_table(
        'attempt_usage',
        sa.Column('task_id', sa.String(length=40), primary_key=True),
        sa.Column('attempt', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('task_pk', sa.Integer(), nullable=False),
        sa.Column('owner', sa.String(length=200), nullable=False),
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('region', sa.String(length=64), nullable=True),
        sa.Column('started_at', sa.Float(), nullable=False),
        sa.Column('ended_at', sa.Float(), nullable=False),
        sa.Column('cpu', sa.Float(), nullable=False),
        sa.Column('memory_mb', sa.Integer(), nullable=False),
        sa.Column('gpu', sa.Integer(), nullable=False),
        sa.Column('run_s', sa.Float(), nullable=False),
        sa.Column('vcpu_s', sa.Float(), nullable=False),
        sa.Column('memory_gib_s', sa.Float(), nullable=False),
        sa.Column('gpu_s', sa.Float(), nullable=False),
        sa.Column('cost', sa.Float(), nullable=True),
        sa.Column('currency', sa.String(length=8), nullable=False),
    )
    # (covering: a budget's sum over a period reads the index alone)
    op.create_index('ix_attempt_usage_owner', 'attempt_usage', ['owner', 'ended_at', 'cost'])
    op.create_index('ix_attempt_usage_ended', 'attempt_usage', ['ended_at', 'task_pk', 'cost'])
    op.create_table(
        'budgets',
        sa.Column('scope', sa.String(length=8), primary_key=True),
        sa.Column('subject', sa.String(length=200), primary_key=True),
        sa.Column('period', sa.String(length=8), nullable=False),
        sa.Column('amount', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('budgets')
    op.drop_index('ix_attempt_usage_ended', table_name='attempt_usage')
    op.drop_index('ix_attempt_usage_owner', table_name='attempt_usage')
    op.drop_table('attempt_usage')
    # SQLite 3.35+ and PostgreSQL drop a column in place (no rebuild: the triggers stay).
    op.execute("ALTER TABLE tasks DROP COLUMN estimate_cost")
