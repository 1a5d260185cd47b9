"""The worker: stage heartbeats, run attempts per job, publications, encrypted organisation secrets.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run_attempts', sa.Integer(), server_default='0', nullable=False))
    op.create_table('publications',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('location', sa.String(length=2048), nullable=False),
    sa.Column('revision', sa.String(length=200), nullable=True),
    sa.Column('url', sa.String(length=2048), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_publications_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_publications')),
    sa.UniqueConstraint('job_id', 'kind', 'location', name=op.f('uq_publications_job_id_kind_location'))
    )
    with op.batch_alter_table('publications', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_publications_job_id'), ['job_id'], unique=False)
    op.create_table('org_secrets',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('ciphertext', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['organisations.id'], name=op.f('fk_org_secrets_org_id_organisations'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', 'name', name=op.f('pk_org_secrets'))
    )


def downgrade() -> None:
    op.drop_table('org_secrets')
    with op.batch_alter_table('publications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_publications_job_id'))
    op.drop_table('publications')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('run_attempts')
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.drop_column('heartbeat_at')
