"""Generation at cluster scale: one job's regeneration shards, claimed by several workers at once.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('generate_shards',
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('shard', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('prompts', sa.Integer(), nullable=False),
    sa.Column('prompts_done', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_generate_shards_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'shard', name=op.f('pk_generate_shards'))
    )


def downgrade() -> None:
    op.drop_table('generate_shards')
