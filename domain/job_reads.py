"""The read side of jobs: a job as the plain row its response is built from, pages of an organisation's jobs,
their children (stage runs, publications, labels) in one query, and counts.

These reads serve the API's hottest routes (a job list, a job, its events), so each is one round trip of plain rows
(no ORM entity: building one per job, run and label cost more CPU than the rest of a job list) from statements
built once with bound parameters (building a SELECT costs 50-250 us of CPU per request; SQLAlchemy caches the
compiled SQL, not the statement object). The writes (admission, cancel, resume) are domain/jobs.py's.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    Row,
    Select,
    String,
    Text,
    bindparam,
    cast,
    exists,
    func,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from domain.errors import NotFound
from domain.models import Job, JobLabel, Publication, StageRun, UTCDateTime

# The columns a job's response reads (api/views.py `jobs_to_out`), as a plain row: the spec as its JSON text
# (`spec_text`, parsed and validated once per distinct text by domain/jobs.py `load_stored_spec_text`), no ORM entity.
JOB_COLUMNS = (
    Job.id, Job.status, Job.stage, Job.name, cast(Job.spec, Text).label("spec_text"), Job.error_code,
    Job.error_message, Job.error_stage, Job.cancel_requested_at, Job.resume_count, Job.run_attempts, Job.created_at,
    Job.updated_at, Job.started_at, Job.finished_at,
)


def jobs_by_status(session: Session) -> dict[str, int]:
    """How many jobs are in each status, all organisations (the API's Prometheus gauge)."""
    return dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())


def job_status(db: Session | Connection, job_id: str) -> str | None:
    """A job's status, or None when there is no such job (any organisation: the caller has checked)."""
    return db.scalar(select(Job.status).where(Job.id == job_id))


_JOB_ROW = select(*JOB_COLUMNS).where(Job.id == bindparam("job_id"), Job.org_id == bindparam("org_id"))
_JOB_STATE = select(Job.id, Job.status, Job.event_seq).where(Job.id == bindparam("job_id"),
                                                             Job.org_id == bindparam("org_id"))


def job_row_for_org(db: Session | Connection, org_id: str, job_id: str) -> Row[*tuple[Any, ...]]:
    """The job as a row of `JOB_COLUMNS`, if it belongs to `org_id`; otherwise the same 404 as domain/jobs.py
    `get_job_for_org`.
    For reading a job's response body (a Connection skips the ORM's per-statement work)."""
    row = db.execute(_JOB_ROW, {"job_id": job_id, "org_id": org_id}).first()
    if row is None:
        raise NotFound(f"no job {job_id!r} in your organisation")
    return row


def job_state_for_org(session: Session | Connection, org_id: str, job_id: str) -> Row[str, str, int]:
    """The job's `id`, `status` and `event_seq` (a row), if it belongs to `org_id`; otherwise the same 404 as domain/jobs.py
    `get_job_for_org`. For reads that need no more of the job (its events, its metrics): the full row carries
    the spec, and loading it as an entity costs more than the rest of such a request."""
    row = session.execute(_JOB_STATE, {"job_id": job_id, "org_id": org_id}).first()
    if row is None:
        raise NotFound(f"no job {job_id!r} in your organisation")
    return row


def list_jobs(
    db: Session | Connection, org_id: str, *, statuses: list[str], labels: list[tuple[str, str]], limit: int,
    after: str | None,
) -> tuple[list[Row[*tuple[Any, ...]]], bool]:
    """A page of the organisation's jobs, newest first, as rows of `JOB_COLUMNS`; and whether more follow."""
    params: dict[str, Any] = {"org_id": org_id, "limit": limit + 1, "statuses": statuses, "after": after}
    for index, (key, value) in enumerate(labels):
        params[f"label_key_{index}"], params[f"label_value_{index}"] = key, value
    rows = db.execute(_job_page_query(bool(statuses), len(labels), after is not None), params).all()
    return list(rows[:limit]), len(rows) > limit


@functools.lru_cache(maxsize=128)
def _job_page_query(statuses: bool, labels: int, after: bool) -> Select[*tuple[Any, ...]]:
    """`list_jobs`' statement for one shape of filters (built once per shape; the values are bound parameters)."""
    query = select(*JOB_COLUMNS).where(Job.org_id == bindparam("org_id"))
    if statuses:
        query = query.where(Job.status.in_(bindparam("statuses", expanding=True)))
    for index in range(labels):
        query = query.where(exists().where(JobLabel.job_id == Job.id, JobLabel.key == bindparam(f"label_key_{index}"),
                                           JobLabel.value == bindparam(f"label_value_{index}")))
    if after:
        query = query.where(Job.id < bindparam("after"))  # ids are time-ordered: newest first, cursor = last id seen
    return query.order_by(Job.id.desc()).limit(bindparam("limit"))


# A job's labels, stage runs and publications come from one query (a UNION ALL of the three, as plain rows).
# Columns: part (0 run, 1 publication, 2 label), job_id, six texts, an int, a float, two timestamps; the first
# SELECT (runs, real columns) gives the result types. Runs are ordered by (started_at, attempt) and publications by
# created_at; labels are sorted by key by the caller.
def _none(type_: Any) -> Any:
    return cast(null(), type_)


_TEXT, _WHEN = String(), UTCDateTime()
_CHILDREN = union_all(
    select(literal_column("0").label("part"), StageRun.job_id, StageRun.id.label("s1"), StageRun.stage.label("s2"),
           StageRun.status.label("s3"), StageRun.worker_id.label("s4"), StageRun.error_code.label("s5"),
           StageRun.error_message.label("s6"), StageRun.attempt.label("n1"), StageRun.progress.label("f1"),
           StageRun.started_at.label("d1"), StageRun.finished_at.label("d2")),
    select(literal_column("1"), Publication.job_id, Publication.kind, Publication.location, Publication.revision,
           Publication.url, _none(_TEXT), _none(_TEXT), _none(Integer()), _none(Float()), Publication.created_at,
           _none(_WHEN)),
    select(literal_column("2"), JobLabel.job_id, JobLabel.key, JobLabel.value, _none(_TEXT), _none(_TEXT),
           _none(_TEXT), _none(_TEXT), _none(Integer()), _none(Float()), _none(_WHEN), _none(_WHEN)),
).subquery("children")
_CHILDREN_OF = (
    select(*_CHILDREN.c)
    .where(_CHILDREN.c.job_id.in_(bindparam("job_ids", expanding=True)))
    .order_by(_CHILDREN.c.part, _CHILDREN.c.d1, _CHILDREN.c.n1)
)


def job_children(db: Session | Connection, job_ids: list[str]) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]], dict[str, dict[str, str]]]:
    """The stage runs, publications and labels of the jobs `job_ids`, in one query: three dicts keyed by job id
    (runs and publications as lists of plain dicts, in their order; labels as key -> value), empty for a job
    without any."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    publications: dict[str, list[dict[str, Any]]] = defaultdict(list)
    labels: dict[str, dict[str, str]] = defaultdict(dict)
    if job_ids:
        for part, job_id, s1, s2, s3, s4, s5, s6, n1, f1, d1, d2 in db.execute(
            _CHILDREN_OF, {"job_ids": job_ids}
        ).all():
            if part == 0:
                runs[job_id].append({"id": s1, "stage": s2, "attempt": n1, "status": s3, "progress": f1,
                                     "worker_id": s4, "started_at": d1, "finished_at": d2, "error_code": s5,
                                     "error_message": s6})
            elif part == 1:
                publications[job_id].append({"kind": s1, "location": s2, "revision": s3, "url": s4,
                                             "created_at": d1})
            else:
                labels[job_id][s1] = s2
    return runs, publications, labels
