"""Initial schema: tasks, task_tags, task_events, task_logs, artifacts, jobs, leases.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('artifacts',
    sa.Column('artifact_id', sa.String(length=40), nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('content_type', sa.String(length=128), nullable=False),
    sa.Column('store_url', sa.Text(), nullable=False),
    sa.Column('storage_key', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('artifact_id'),
    sa.UniqueConstraint('task_id', 'attempt', 'name', name='uq_artifacts_name')
    )
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.create_index('ix_artifacts_task', ['task_id'], unique=False)

    op.create_table('jobs',
    sa.Column('worker_id', sa.String(length=40), nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('resource_class', sa.String(length=64), nullable=False),
    sa.Column('job_name', sa.String(length=128), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('handle_json', sa.Text(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('launched_at', sa.Float(), nullable=True),
    sa.Column('seen_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('stop_requested_at', sa.Float(), nullable=True),
    sa.Column('stop_sent_at', sa.Float(), nullable=True),
    sa.Column('event_seq', sa.Integer(), nullable=False),
    sa.Column('provider_status', sa.String(length=32), nullable=True),
    sa.Column('provider_reason', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('worker_id'),
    sa.UniqueConstraint('job_name'),
    sa.UniqueConstraint('task_id', 'attempt', name='uq_jobs_attempt')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_state', ['state'], unique=False)

    op.create_table('leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('task_events',
    sa.Column('pk', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('from_state', sa.String(length=20), nullable=True),
    sa.Column('to_state', sa.String(length=20), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('detail_json', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('pk')
    )
    with op.batch_alter_table('task_events', schema=None) as batch_op:
        batch_op.create_index('ix_task_events_task', ['task_id', 'pk'], unique=False)

    op.create_table('task_logs',
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('stream', sa.String(length=8), nullable=False),
    sa.Column('level', sa.String(length=8), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('task_id', 'seq'),
    sqlite_with_rowid=False
    )
    op.create_table('task_tags',
    sa.Column('task_pk', sa.Integer(), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('submitted_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('task_pk', 'tag')
    )
    with op.batch_alter_table('task_tags', schema=None) as batch_op:
        batch_op.create_index('ix_task_tags_owner_tag', ['owner', 'tag', 'submitted_at', 'task_pk'], unique=False)

    op.create_table('tasks',
    sa.Column('pk', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('tool_name', sa.String(length=128), nullable=False),
    sa.Column('inputs_json', sa.Text(), nullable=False),
    sa.Column('input_size', sa.Float(), nullable=True),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('resource_class', sa.String(length=64), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('ttl_s', sa.Integer(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('tags_json', sa.Text(), nullable=False),
    sa.Column('resources_json', sa.Text(), nullable=False),
    sa.Column('max_runtime_s', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('not_before', sa.Float(), nullable=False),
    sa.Column('submitted_at', sa.Float(), nullable=False),
    sa.Column('scheduled_at', sa.Float(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('heartbeat_at', sa.Float(), nullable=True),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('completed_at', sa.Float(), nullable=True),
    sa.Column('expires_at', sa.Float(), nullable=True),
    sa.Column('timeout_at', sa.Float(), nullable=True),
    sa.Column('worker_id', sa.String(length=40), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('cancel_reason', sa.String(length=500), nullable=True),
    sa.Column('stop_reason', sa.String(length=20), nullable=True),
    sa.Column('progress_json', sa.Text(), nullable=True),
    sa.Column('result_json', sa.Text(), nullable=True),
    sa.Column('error_json', sa.Text(), nullable=True),
    sa.Column('metrics_json', sa.Text(), nullable=True),
    sa.Column('estimate_s', sa.Float(), nullable=True),
    sa.Column('log_seq', sa.Integer(), nullable=False),
    sa.Column('log_first_seq', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('pk'),
    sa.UniqueConstraint('owner', 'tool_name', 'idempotency_key', name='uq_tasks_idempotency'),
    sa.UniqueConstraint('task_id')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_dispatch', ['resource_class', 'state', sa.text('priority DESC'), 'pk'], unique=False)
        batch_op.create_index('ix_tasks_owner', ['owner', 'submitted_at', 'pk'], unique=False)
        batch_op.create_index('ix_tasks_owner_state', ['owner', 'state', 'submitted_at', 'pk'], unique=False)
        batch_op.create_index('ix_tasks_owner_tool', ['owner', 'tool_name', 'submitted_at', 'pk'], unique=False)
        batch_op.create_index('ix_tasks_state_expires', ['state', 'expires_at'], unique=False)
        batch_op.create_index('ix_tasks_state_timeout', ['state', 'timeout_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_state_timeout')
        batch_op.drop_index('ix_tasks_state_expires')
        batch_op.drop_index('ix_tasks_owner_tool')
        batch_op.drop_index('ix_tasks_owner_state')
        batch_op.drop_index('ix_tasks_owner')
        batch_op.drop_index('ix_tasks_dispatch')

    op.drop_table('tasks')
    with op.batch_alter_table('task_tags', schema=None) as batch_op:
        batch_op.drop_index('ix_task_tags_owner_tag')

    op.drop_table('task_tags')
    op.drop_table('task_logs')
    with op.batch_alter_table('task_events', schema=None) as batch_op:
        batch_op.drop_index('ix_task_events_task')

    op.drop_table('task_events')
    op.drop_table('leases')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_state')

    op.drop_table('jobs')
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_index('ix_artifacts_task')

    op.drop_table('artifacts')
