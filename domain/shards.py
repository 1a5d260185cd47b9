"""A job's regeneration shards while its generate stage is spread over several workers (worker/shards.py).

Shard claims in the database, not a Celery group with a final gather (a chord): the job's rows, not a result
backend, hold the truth (a deployment runs without one); a chord's gather is one broker message, lost with a
Redis restart; and a chord member whose worker was SIGKILLed comes back only after the broker's visibility
timeout (hours). With claims, any participant takes over a shard whose holder stopped beating for
worker_stale_after_seconds, and the worker that runs the stage knows when every shard is whole. Every function
commits before it returns; a claim is a conditional update, so of two workers racing for a shard one wins.

    plan_shards(session, job_id, sizes)       a row per shard (again on a resumed stage: the rows are kept)
    claim_shard(session, job_id, worker_id, stale_after_seconds) -> ShardClaim | None
    shard_heartbeat(session, job_id, shard, worker_id, prompts_done, tokens) -> still this worker's?
    finish_shard(session, job_id, shard, worker_id, prompts, tokens, seconds)   its files are in storage
    release_shard(session, job_id, shard, worker_id)   pending again (a worker that stops on request)
    shard_rows(session, job_id)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from domain.db import execute_dml
from domain.models import GenerateShard, utcnow

PENDING, RUNNING, DONE = "pending", "running", "done"


@dataclass(frozen=True)
class ShardClaim:
    shard: int
    attempt: int
    taken_from: str | None
    """The worker that held it before and went quiet (a takeover), else None."""


def plan_shards(session: Session, job_id: str, sizes: list[int]) -> int:
    """Rows for shards 0..len(sizes)-1 with their prompt counts; existing rows are kept. Returns the count."""
    have = set(session.scalars(select(GenerateShard.shard).where(GenerateShard.job_id == job_id)))
    session.add_all(GenerateShard(job_id=job_id, shard=index, status=PENDING, attempt=0, prompts=size,
                                  prompts_done=0, tokens=0) for index, size in enumerate(sizes) if index not in have)
    session.commit()
    return len(sizes)


def _claimable(stale_after_seconds: float) -> ColumnElement[bool]:
    cutoff = utcnow() - timedelta(seconds=stale_after_seconds)
    return or_(GenerateShard.status == PENDING,
               and_(GenerateShard.status == RUNNING,
                    or_(GenerateShard.heartbeat_at < cutoff, GenerateShard.heartbeat_at.is_(None))))


def claim_shard(session: Session, job_id: str, worker_id: str, stale_after_seconds: float) -> ShardClaim | None:
    """The lowest shard that is pending, or running without a heartbeat for `stale_after_seconds`, now held by
    `worker_id`; None when no shard is free to claim."""
    candidates = session.execute(
        select(GenerateShard.shard, GenerateShard.attempt, GenerateShard.status, GenerateShard.worker_id)
        .where(GenerateShard.job_id == job_id, _claimable(stale_after_seconds)).order_by(GenerateShard.shard)
    ).all()
    session.rollback()
    for shard, attempt, status, holder in candidates:
        now = utcnow()
        claimed = execute_dml(session,
            update(GenerateShard)
            .where(GenerateShard.job_id == job_id, GenerateShard.shard == shard, GenerateShard.attempt == attempt,
                   _claimable(stale_after_seconds))
            .values(status=RUNNING, attempt=attempt + 1, worker_id=worker_id, heartbeat_at=now, prompts_done=0,
                    tokens=0, seconds=None, finished_at=None)
            .execution_options(synchronize_session=False)
        ).rowcount
        session.commit()
        if claimed:
            return ShardClaim(shard, attempt + 1, holder if status == RUNNING else None)
    return None


def shard_heartbeat(session: Session, job_id: str, shard: int, worker_id: str, prompts_done: int,
                    tokens: int) -> bool:
    """Refresh this worker's claim and its progress. False: the shard is no longer this worker's (taken over
    after a stall, or done)."""
    beat = execute_dml(session,
        update(GenerateShard)
        .where(GenerateShard.job_id == job_id, GenerateShard.shard == shard, GenerateShard.status == RUNNING,
               GenerateShard.worker_id == worker_id)
        .values(heartbeat_at=utcnow(), prompts_done=prompts_done, tokens=tokens)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.commit()
    return beat > 0


def finish_shard(session: Session, job_id: str, shard: int, worker_id: str, *, prompts: int, tokens: int,
                 seconds: float) -> bool:
    """The shard's files are in object storage: it is done, whoever held the claim by now (a shard written twice
    is the same shard: its seed is its index). False if it was done already."""
    finished = execute_dml(session,
        update(GenerateShard)
        .where(GenerateShard.job_id == job_id, GenerateShard.shard == shard, GenerateShard.status != DONE)
        .values(status=DONE, worker_id=worker_id, prompts_done=prompts, tokens=tokens, seconds=seconds,
                finished_at=utcnow(), heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    ).rowcount
    session.commit()
    return finished > 0


def release_shard(session: Session, job_id: str, shard: int, worker_id: str) -> None:
    """This worker stops before writing the shard (cancelled, or shutting down): another may claim it at once."""
    session.execute(
        update(GenerateShard)
        .where(GenerateShard.job_id == job_id, GenerateShard.shard == shard, GenerateShard.status == RUNNING,
               GenerateShard.worker_id == worker_id)
        .values(status=PENDING, heartbeat_at=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()


@dataclass(frozen=True)
class ShardRow:
    shard: int
    status: str
    attempt: int
    worker_id: str | None
    prompts: int
    prompts_done: int
    tokens: int
    seconds: float | None


def shard_rows(session: Session, job_id: str) -> list[ShardRow]:
    rows = [ShardRow(r.shard, r.status, r.attempt, r.worker_id, r.prompts, r.prompts_done, r.tokens, r.seconds)
            for r in session.scalars(select(GenerateShard).where(GenerateShard.job_id == job_id)
                                     .order_by(GenerateShard.shard).execution_options(populate_existing=True))]
    session.rollback()  # end the read, so the next poll sees other workers' commits
    return rows
