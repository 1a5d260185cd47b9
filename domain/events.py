"""The job event log: an append-only, per-job numbered journal that the SSE stream replays.

Sequence numbers come from `jobs.event_seq`, incremented with an UPDATE of the job row. That
UPDATE takes the row lock (PostgreSQL) or the write lock (SQLite) until commit, so two writers
for one job are serialised and events become visible in sequence order: a reader that saw seq N
never later finds a new event with a number below N. Streams can therefore resume from
`Last-Event-ID` with a plain `seq > N` query.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from domain.models import Job, JobEvent, utcnow

EVENT_TYPES = (
    "job.created",
    "job.status_changed",
    "job.resumed",
    "job.cancel_requested",
    "stage.started",
    "stage.progress",
    "stage.finished",
    "stage.failed",
    "stage.released",
    "artifact.created",
    "publish.completed",
    "log",
)
EVENT_LEVELS = ("debug", "info", "warning", "error")


def append_event(
    session: Session,
    job: Job,
    event_type: str,
    message: str,
    *,
    stage: str | None = None,
    level: str = "info",
    progress: float | None = None,
    data: dict[str, Any] | None = None,
) -> JobEvent:
    """Add one event to `job`'s log in the caller's transaction (the caller commits)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}; one of {', '.join(EVENT_TYPES)}")
    if level not in EVENT_LEVELS:
        raise ValueError(f"unknown event level {level!r}; one of {', '.join(EVENT_LEVELS)}")
    if progress is not None and (not math.isfinite(progress) or not 0.0 <= progress <= 100.0):
        raise ValueError(f"progress must be a percentage in [0, 100], got {progress!r}")
    jobs = Job.__table__
    seq = session.execute(
        update(jobs).where(jobs.c.id == job.id).values(event_seq=jobs.c.event_seq + 1).returning(jobs.c.event_seq)
    ).scalar_one()
    set_committed_value(job, "event_seq", seq)
    event = JobEvent(
        job_id=job.id,
        seq=seq,
        created_at=utcnow(),
        type=event_type,
        level=level,
        stage=stage,
        message=message[:10_000],
        progress=progress,
        data=data,
    )
    session.add(event)
    session.flush()
    return event


# What a reader of the log sees of an event: `events_after` returns rows of these columns, not entities (building
# a JobEvent entity per row cost as much again as reading it, on the paged events route).
EVENT_COLUMNS = (JobEvent.seq, JobEvent.created_at, JobEvent.type, JobEvent.level, JobEvent.stage, JobEvent.message,
                 JobEvent.progress, JobEvent.data)


def events_after(session: Session, job_id: str, after_seq: int, limit: int) -> list[Row[Any]]:
    """Events of one job with seq > after_seq, oldest first: read-only rows with the attributes of JobEvent
    named in EVENT_COLUMNS (seq, created_at, type, level, stage, message, progress, data)."""
    query = (
        select(*EVENT_COLUMNS)
        .where(JobEvent.job_id == job_id, JobEvent.seq > after_seq)
        .order_by(JobEvent.seq)
        .limit(limit)
    )
    return list(session.execute(query))
