"""Response bodies built from domain rows: the HTTP layer's view of jobs, drafters and audits.

The domain (domain/jobs.py, domain/drafters.py, domain/audits.py) returns rows; the response models live in api/schemas.py; this module is the one place that turns one into the other.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import Connection, Float, Integer, String, bindparam, cast, literal_column, null, select, union_all
from sqlalchemy.orm import Session

from domain.drafters import drafter_chain, publications_by_job
from domain.jobs import load_stored_spec, load_stored_spec_text
from domain.models import Audit, Drafter, JobLabel, Publication, StageRun, UTCDateTime
from api.schemas import (
    AuditError,
    AuditOut,
    DrafterDetail,
    DrafterLink,
    DrafterOut,
    JobOut,
)
from schemas.job_spec import JobSpec


# A job's labels, stage runs and publications come from one query (a UNION ALL of the three, as plain rows: an
# ORM entity per label, run and publication cost more CPU than the rest of a job list, and each round trip costs as
# much again; issue 32). Columns: part (0 run, 1 publication, 2 label), job_id, six texts, an int, a float, two
# timestamps; the first SELECT (runs, real columns) gives the result types. Runs are ordered by (started_at,
# attempt) and publications by created_at, as before; labels are sorted by key when the body is built.
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


def _spec(job: Any) -> JobSpec:
    text = getattr(job, "spec_text", None)  # a row of domain.jobs.JOB_COLUMNS; an entity has `spec`
    return load_stored_spec_text(text) if text is not None else load_stored_spec(job.spec)


def jobs_to_out(db: Session | Connection, jobs: list[Any]) -> list[JobOut]:
    """Response bodies of jobs (Job entities, or rows of domain.jobs.JOB_COLUMNS) with one extra query in total for
    their labels, stage runs and publications."""
    labels: dict[str, dict[str, str]] = defaultdict(dict)
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    publications: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if jobs:
        for part, job_id, s1, s2, s3, s4, s5, s6, n1, f1, d1, d2 in db.execute(
            _CHILDREN_OF, {"job_ids": [job.id for job in jobs]}
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
    bodies = []
    for job in jobs:
        job_runs = runs[job.id]
        current = next((r for r in reversed(job_runs) if r["stage"] == job.stage), None)
        bodies.append({
            "id": job.id,
            "status": job.status,
            "stage": job.stage,
            "stage_progress": current["progress"] if current else None,
            "name": job.name,
            "labels": dict(sorted(labels[job.id].items())),
            "spec": _spec(job),
            "error": {"code": job.error_code, "message": job.error_message or "", "stage": job.error_stage}
            if job.error_code
            else None,
            "cancel_requested": job.cancel_requested_at is not None,
            "resume_count": job.resume_count,
            "run_attempts": job.run_attempts,
            "created_at": job.created_at,
            "updated_at": job.updated_at,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "stages": job_runs,
            "publications": publications[job.id],
        })
    return _JOBS_OUT.validate_python(bodies)  # one validation for the page, not a model per job, run and label


_JOBS_OUT = TypeAdapter(list[JobOut])


def drafter_out(row: Drafter, publications: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": row.id, "job_id": row.job_id, "name": row.name, "created_at": row.created_at,
        "target": {"uri": row.target_uri, "revision": row.target_revision, "fingerprint": row.target_fingerprint},
        "parent": {"id": row.parent_id, "ref": row.parent_ref} if row.parent_ref else None,
        "variant": row.variant, "block_size": row.block_size, "num_layers": row.num_layers, "tau": row.tau,
        "lossless": row.lossless, "config": row.config, "metrics": row.metrics, "lineage": row.lineage,
        "manifest_sha256": row.manifest_sha256, "artifacts_path": f"/v1/jobs/{row.job_id}/artifacts",
        "publications": publications,
    }


def drafters_out(session: Session, rows: list[Drafter]) -> list[DrafterOut]:
    publications = publications_by_job(session, [row.job_id for row in rows])
    return [DrafterOut.model_validate(drafter_out(row, publications[row.job_id])) for row in rows]


def drafter_detail(session: Session, org_id: str, drafter_id: str) -> DrafterDetail:
    row, chain = drafter_chain(session, org_id, drafter_id)
    links = [DrafterLink(id=link.id, job_id=link.job_id, created_at=link.created_at, target_uri=link.target_uri,
                         target_revision=link.target_revision, tau=link.tau, parent_ref=link.parent_ref)
             for link in chain]
    out = drafter_out(row, publications_by_job(session, [row.job_id])[row.job_id])
    return DrafterDetail.model_validate({**out, "chain": [link.model_dump() for link in links]})


def audit_out(row: Audit) -> AuditOut:
    return AuditOut(id=row.id, status=row.status, drafter=row.drafter_ref, drafter_id=row.drafter_id,  # type: ignore[arg-type]
                    target_uri=row.target_uri, target_revision=row.target_revision,
                    recommendation=row.recommendation, result=row.result,  # type: ignore[arg-type]
                    error=AuditError(code=row.error_code, message=row.error_message or "") if row.error_code else None,
                    spec=row.spec, attempts=row.attempts, created_at=row.created_at, started_at=row.started_at,
                    finished_at=row.finished_at)
