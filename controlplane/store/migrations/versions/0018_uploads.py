"""Uploads: files a caller brings, before any task refers to them.

`uploads` holds one row per upload (`upl_...`): who owns it (and the team it was made under),
what the caller promised (name, size, sha256, content type), where its bytes go (the store and
the key under `uploads/<upload_id>/`), the store's resumable session when it has one (an S3
multipart upload id), and its state (pending until verified, then complete) and expiry. A new
table: nothing else is touched.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'uploads',
        sa.Column('upload_id', sa.String(length=40), primary_key=True),
        sa.Column('owner', sa.String(length=200), nullable=False),
        sa.Column('team', sa.String(length=200), nullable=True),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('size_bytes', sa.BigInteger(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('content_type', sa.String(length=128), nullable=False),
        sa.Column('store_url', sa.Text(), nullable=False),
        sa.Column('storage_key', sa.Text(), nullable=False),
        sa.Column('session', sa.Text(), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
        sa.Column('completed_at', sa.Float(), nullable=True),
    )
    # A caller's same file asked for again finds its pending upload (resuming).
    op.create_index('ix_uploads_owner', 'uploads', ['owner', 'sha256', 'size_bytes', 'name'])
    # Retention walks expired uploads, oldest first.
    op.create_index('ix_uploads_expires', 'uploads', ['expires_at'])


def downgrade() -> None:
    op.drop_index('ix_uploads_expires', table_name='uploads')
    op.drop_index('ix_uploads_owner', table_name='uploads')
    op.drop_table('uploads')
