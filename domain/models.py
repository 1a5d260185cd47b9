"""Database models (SQLAlchemy 2, typed `Mapped[]`). The database is the source of truth for jobs.

Every tenant-owned row reaches an organisation through `org_id` (directly or via its job), and
every query in the routes filters on it. Ids are prefixed and time-ordered ("job_01J...") so
sorting by id is sorting by creation, which makes cursor pagination a plain `id < :cursor`.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # ASCII-ordered, so string order = numeric order


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """`prefix` + 48-bit millisecond timestamp + 80 random bits, ULID-style (26 characters)."""
    return prefix + _base32(int(time.time() * 1000), 10) + _base32(secrets.randbits(80), 16)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite has no timezone storage)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, list[str]: JSONType}


class Organisation(Base):
    __tablename__ = "organisations"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("org_"))
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # None: the deployment default (settings.default_max_concurrent_jobs) applies.
    max_concurrent_jobs: Mapped[int | None] = mapped_column(Integer)
    # Monthly quotas (UTC calendar month); None: the deployment default (settings.default_monthly_*) applies.
    monthly_compute_seconds: Mapped[int | None] = mapped_column(BigInteger)
    monthly_tokens_generated: Mapped[int | None] = mapped_column(BigInteger)
    monthly_tokens_trained: Mapped[int | None] = mapped_column(BigInteger)
    # The organisation's audit rule (schemas/audit.py AuditThresholds); None: the defaults.
    audit_thresholds: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Touched (UPDATE) to serialise job admission per organisation on both PostgreSQL and SQLite.
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key_"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))  # first characters, to recognise a key in listings
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(64))  # comma-separated: read,write,admin
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("org_id", "idempotency_key"),
        Index(None, "org_id", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job_"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    stage: Mapped[str | None] = mapped_column(String(16))  # the stage running now, or the last one that ran
    name: Mapped[str | None] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_stage: Mapped[str | None] = mapped_column(String(16))
    cancel_requested_at: Mapped[datetime | None]
    resume_count: Mapped[int] = mapped_column(default=0)
    # Times a worker picked the job up (first delivery, redeliveries after a lost worker, retries).
    run_attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    # Last event sequence number; incremented under the job's row lock so events commit in order.
    event_seq: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # Optimistic lock: a stale read (API vs worker racing) fails the UPDATE instead of overwriting.
    version: Mapped[int] = mapped_column(default=1)

    __mapper_args__ = {"version_id_col": version}


class JobLabel(Base):
    """Labels in their own table so `?label=key:value` is an indexed lookup on both databases."""

    __tablename__ = "job_labels"
    __table_args__ = (Index(None, "key", "value"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class StageRun(Base):
    """One attempt at one stage. A retried or resumed stage gets a new row with attempt + 1."""

    __tablename__ = "stage_runs"
    __table_args__ = (UniqueConstraint("job_id", "stage", "attempt"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("run_"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    stage: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int]
    status: Mapped[str] = mapped_column(String(16))  # a domain/statuses.py StageRunStatus
    worker_id: Mapped[str | None] = mapped_column(String(200))
    progress: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # Refreshed by the worker while the attempt runs; a stale one means the worker is gone.
    heartbeat_at: Mapped[datetime | None]


class GenerateShard(Base):
    """One shard of a job's regeneration while the generate stage is spread over several workers
    (domain/shards.py, worker/shards.py). One worker holds a shard at a time; a holder whose heartbeat went stale
    is presumed dead, and any other may take the shard over. `done` means its files are in object storage."""

    __tablename__ = "generate_shards"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))  # pending|running|done
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # claims so far; a takeover counts one more
    worker_id: Mapped[str | None] = mapped_column(String(200))
    prompts: Mapped[int] = mapped_column(Integer)
    prompts_done: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float | None] = mapped_column(Float)
    """Wall seconds of the attempt that wrote it."""
    heartbeat_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int]  # 1, 2, 3... per job; the SSE `id:` and the paging cursor
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    type: Mapped[str] = mapped_column(String(40))
    level: Mapped[str] = mapped_column(String(10), default="info")
    stage: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    progress: Mapped[float | None] = mapped_column(Float)
    data: Mapped[dict[str, Any] | None]


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (Index(None, "job_id", "name", "step"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    stage: Mapped[str | None] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(100))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Float)  # None records a non-finite value (NaN loss)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("art_"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    stage: Mapped[str | None] = mapped_column(String(16))
    storage_key: Mapped[str] = mapped_column(String(1024))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    content_type: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PromptFile(Base):
    """An uploaded prompts file (JSONL), referenced by jobs as data.source = its id."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("file-"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    prompt_count: Mapped[int]
    storage_key: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("wh_"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    # Kept retrievable (not hashed): every delivery is signed with it.
    secret: Mapped[str] = mapped_column(String(100))
    event_types: Mapped[list[str]]
    description: Mapped[str | None] = mapped_column(String(500))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class WebhookDelivery(Base):
    """One event message for one endpoint; its id is the Standard Webhooks `webhook-id`."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index(None, "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("msg_"))
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(40))
    event_type: Mapped[str] = mapped_column(String(40))
    payload: Mapped[str] = mapped_column(Text)  # the exact bytes signed and sent, on every attempt
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|succeeded|failed
    attempt_count: Mapped[int] = mapped_column(default=0)
    next_attempt_at: Mapped[datetime | None]
    locked_until: Mapped[datetime | None]  # a dispatcher's claim, so two API processes never double-send
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookAttempt(Base):
    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int]
    attempted_at: Mapped[datetime] = mapped_column(default=utcnow)
    status_code: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(String(500))
    duration_ms: Mapped[int]
    succeeded: Mapped[bool] = mapped_column(Boolean)


class Publication(Base):
    """Where a job's artifacts were published (an S3 prefix, a Hub repo) and the exact version written."""

    __tablename__ = "publications"
    __table_args__ = (UniqueConstraint("job_id", "kind", "location"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("pub_"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # s3 | hf
    location: Mapped[str] = mapped_column(String(2048))  # s3://bucket/prefix or the Hub repo URL
    revision: Mapped[str | None] = mapped_column(String(200))  # Hub commit sha; S3: the manifest's sha256
    url: Mapped[str | None] = mapped_column(String(2048))  # a browsable address (the Hub commit page)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OrgSecret(Base):
    """A credential an organisation stores for publishing, encrypted at rest (domain/secrets.py); only its name
    is ever shown back."""

    __tablename__ = "org_secrets"

    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Drafter(Base):
    """A succeeded job's published drafter and its lineage: what it was trained for (target URI, pinned revision,
    fingerprint), on what (the data snapshot), from what (its parent drafter, the recipe), with what (code and
    package versions), and how well it did (validation metrics). Recorded by the worker in the publish stage."""

    __tablename__ = "drafters"
    __table_args__ = (Index(None, "org_id", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("drf_"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("drafters.id", ondelete="SET NULL"), index=True)
    parent_ref: Mapped[str | None] = mapped_column(String(2048))  # init.from_drafter as given (an id or a URI)
    name: Mapped[str | None] = mapped_column(String(128))
    target_uri: Mapped[str] = mapped_column(String(2048))
    target_revision: Mapped[str | None] = mapped_column(String(200))
    target_fingerprint: Mapped[str] = mapped_column(String(80))
    variant: Mapped[str] = mapped_column(String(16))
    block_size: Mapped[int]
    num_layers: Mapped[int]
    tau: Mapped[float | None] = mapped_column(Float)
    lossless: Mapped[bool] = mapped_column(Boolean)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]]  # the drafter's shape: hidden/vocab size, taps, mask token...
    lineage: Mapped[dict[str, Any]]  # data snapshot, recipe, code and package versions
    metrics: Mapped[dict[str, Any]]  # validation: tau per position and category, lossless, speedup, parent tau
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Audit(Base):
    """A drift audit: an existing drafter measured against a (new) target checkpoint. A small job of its own:
    queued by the API, run by a worker (`draftsmith.run_audit`), its row the source of truth."""

    __tablename__ = "audits"
    __table_args__ = (Index(None, "org_id", "id"), Index(None, "status", "heartbeat_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("aud_"))
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16))  # queued|running|succeeded|failed|cancelling|cancelled
    spec: Mapped[dict[str, Any]]  # the audit as admitted, every default resolved (schemas/audit.py)
    drafter_ref: Mapped[str] = mapped_column(String(2048))
    drafter_id: Mapped[str | None] = mapped_column(ForeignKey("drafters.id", ondelete="SET NULL"))
    target_uri: Mapped[str] = mapped_column(String(2048))
    target_revision: Mapped[str | None] = mapped_column(String(200))
    recommendation: Mapped[str | None] = mapped_column(String(16))  # keep|warm_start|retrain
    result: Mapped[dict[str, Any] | None]
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(default=0)
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class UsageRecord(Base):
    """Compute and tokens one stage attempt (or audit) spent, appended as it ends. An organisation's usage in a
    period is the sum of its records (domain/usage.py); quotas are checked against it at submit time."""

    __tablename__ = "usage_records"
    __table_args__ = (Index(None, "org_id", "recorded_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organisations.id", ondelete="CASCADE"))
    job_id: Mapped[str | None] = mapped_column(String(40), index=True)
    audit_id: Mapped[str | None] = mapped_column(String(40))
    stage: Mapped[str | None] = mapped_column(String(16))
    compute_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    tokens_generated: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_trained: Mapped[int] = mapped_column(BigInteger, default=0)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)
