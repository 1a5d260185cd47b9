"""Fine-tune pipelines: published drafters with their lineage, drift audits, usage records, and the
organisations' monthly quotas and audit thresholds.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 14:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('usage_records',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=True),
    sa.Column('audit_id', sa.String(length=40), nullable=True),
    sa.Column('stage', sa.String(length=16), nullable=True),
    sa.Column('compute_seconds', sa.Float(), nullable=False),
    sa.Column('tokens_generated', sa.BigInteger(), nullable=False),
    sa.Column('tokens_trained', sa.BigInteger(), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['organisations.id'], name=op.f('fk_usage_records_org_id_organisations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_records'))
    )
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_usage_records_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_usage_records_org_id_recorded_at'), ['org_id', 'recorded_at'], unique=False)

    op.create_table('drafters',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('parent_id', sa.String(length=40), nullable=True),
    sa.Column('parent_ref', sa.String(length=2048), nullable=True),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('target_uri', sa.String(length=2048), nullable=False),
    sa.Column('target_revision', sa.String(length=200), nullable=True),
    sa.Column('target_fingerprint', sa.String(length=80), nullable=False),
    sa.Column('variant', sa.String(length=16), nullable=False),
    sa.Column('block_size', sa.Integer(), nullable=False),
    sa.Column('num_layers', sa.Integer(), nullable=False),
    sa.Column('tau', sa.Float(), nullable=True),
    sa.Column('lossless', sa.Boolean(), nullable=False),
    sa.Column('manifest_sha256', sa.String(length=64), nullable=False),
    sa.Column('config', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('lineage', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('metrics', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_drafters_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['org_id'], ['organisations.id'], name=op.f('fk_drafters_org_id_organisations'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_id'], ['drafters.id'], name=op.f('fk_drafters_parent_id_drafters'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_drafters')),
    sa.UniqueConstraint('job_id', name=op.f('uq_drafters_job_id'))
    )
    with op.batch_alter_table('drafters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_drafters_org_id'), ['org_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_drafters_org_id_id'), ['org_id', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_drafters_parent_id'), ['parent_id'], unique=False)

    op.create_table('audits',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('spec', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('drafter_ref', sa.String(length=2048), nullable=False),
    sa.Column('drafter_id', sa.String(length=40), nullable=True),
    sa.Column('target_uri', sa.String(length=2048), nullable=False),
    sa.Column('target_revision', sa.String(length=200), nullable=True),
    sa.Column('recommendation', sa.String(length=16), nullable=True),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['drafter_id'], ['drafters.id'], name=op.f('fk_audits_drafter_id_drafters'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['org_id'], ['organisations.id'], name=op.f('fk_audits_org_id_organisations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audits'))
    )
    with op.batch_alter_table('audits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audits_org_id'), ['org_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_audits_org_id_id'), ['org_id', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_audits_status_heartbeat_at'), ['status', 'heartbeat_at'], unique=False)

    with op.batch_alter_table('organisations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('monthly_compute_seconds', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('monthly_tokens_generated', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('monthly_tokens_trained', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('audit_thresholds', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('organisations', schema=None) as batch_op:
        batch_op.drop_column('audit_thresholds')
        batch_op.drop_column('monthly_tokens_trained')
        batch_op.drop_column('monthly_tokens_generated')
        batch_op.drop_column('monthly_compute_seconds')

    with op.batch_alter_table('audits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audits_status_heartbeat_at'))
        batch_op.drop_index(batch_op.f('ix_audits_org_id_id'))
        batch_op.drop_index(batch_op.f('ix_audits_org_id'))

    op.drop_table('audits')
    with op.batch_alter_table('drafters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_drafters_parent_id'))
        batch_op.drop_index(batch_op.f('ix_drafters_org_id_id'))
        batch_op.drop_index(batch_op.f('ix_drafters_org_id'))

    op.drop_table('drafters')
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_usage_records_org_id_recorded_at'))
        batch_op.drop_index(batch_op.f('ix_usage_records_job_id'))

    op.drop_table('usage_records')
