"""The job event log: an append-only, per-job numbered journal that the SSE stream replays.

Sequence numbers come from `jobs.event_seq`, incremented with an UPDATE of the job row. That
UPDATE takes the row lock (PostgreSQL) or the write lock (SQLite) until commit, so two writers
for one job are serialised and events become visible in sequence order: a reader that saw seq N
never later finds a new event with a number below N. Streams can therefore resume from
`Last-Event-ID` with a plain `seq > N` query.
"""

from __future__ import annotations

import math
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, bindparam, select, true, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from domain.errors import NotFound
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
    jobs = cast(Table, Job.__table__)  # declared as a FromClause; a mapped class's table is a Table
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


# Built once, with bound parameters (building these SELECTs cost up to 250 us of CPU per request).
_EVENTS_AFTER = (
    select(*EVENT_COLUMNS)
    .where(JobEvent.job_id == bindparam("job_id"), JobEvent.seq > bindparam("after_seq"))
    .order_by(JobEvent.seq)
    .limit(bindparam("limit"))
)
_PAGE = _EVENTS_AFTER.subquery("page")
_JOB_EVENTS_PAGE = (
    select(Job.id, Job.status, Job.event_seq, *(_PAGE.c[column.key] for column in EVENT_COLUMNS))
    .select_from(Job)
    .outerjoin(_PAGE, true())
    .where(Job.id == bindparam("job_id"), Job.org_id == bindparam("org_id"))
    .order_by(_PAGE.c.seq)
)


def events_after(session: Session | Connection, job_id: str, after_seq: int, limit: int) -> list[Row[*tuple[Any, ...]]]:
    """Events of one job with seq > after_seq, oldest first: read-only rows with the attributes of JobEvent
    named in EVENT_COLUMNS (seq, created_at, type, level, stage, message, progress, data)."""
    # .all(): one fetch of every row (iterating a result fetches row by row).
    return list(session.execute(_EVENTS_AFTER, {"job_id": job_id, "after_seq": after_seq, "limit": limit}).all())


def job_events_page(
    db: Session | Connection, org_id: str, job_id: str, after_seq: int, limit: int
) -> tuple[Row[*tuple[Any, ...]], list[Row[*tuple[Any, ...]]]]:
    """The job's state (`id`, `status`, `event_seq`, as `domain.job_reads.job_state_for_org`) and `events_after(job,
    after_seq, limit)`, in one round trip; the same 404 when the job is not the organisation's.

    The events are a derived table (index order, stops after `limit`) LEFT JOINed to the job's row, so a job
    without such events still answers its state, and the events of another organisation's job are never
    returned (the job's row filters them out). One statement also sees one snapshot: the state and the events
    agree."""
    rows = db.execute(_JOB_EVENTS_PAGE, {"job_id": job_id, "org_id": org_id, "after_seq": after_seq,
                                         "limit": limit}).all()
    if not rows:
        raise NotFound(f"no job {job_id!r} in your organisation")
    return rows[0], [row for row in rows if row.seq is not None]
