"""Response bodies built from domain rows: the HTTP layer's view of jobs, drafters and audits.

The domain (domain/jobs.py, domain/drafters.py, domain/audits.py; `domain/` once the house plan moves them) returns
rows; the response models live in api/schemas.py; this module is the one place that turns one into the other.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from domain.drafters import drafter_chain, publications_by_job
from domain.jobs import load_stored_spec
from domain.models import Audit, Drafter, Job, JobLabel, Publication, StageRun
from api.schemas import (
    AuditError,
    AuditOut,
    DrafterDetail,
    DrafterLink,
    DrafterOut,
    JobError,
    JobOut,
    PublicationOut,
    StageRunOut,
)


# The columns each response reads, as plain rows: an ORM entity per label, run and publication cost more CPU
# than the rest of a job list (issue 32).
_RUN_COLUMNS = (StageRun.job_id, *(getattr(StageRun, name) for name in StageRunOut.model_fields))
_PUBLICATION_COLUMNS = (Publication.job_id, *(getattr(Publication, name) for name in PublicationOut.model_fields))


def jobs_to_out(session: Session, jobs: list[Job]) -> list[JobOut]:
    """Build responses for many jobs with three extra queries in total (labels, stage runs, publications)."""
    ids = [job.id for job in jobs]
    labels: dict[str, dict[str, str]] = defaultdict(dict)
    runs: dict[str, list[Any]] = defaultdict(list)
    publications: dict[str, list[Any]] = defaultdict(list)
    if ids:
        for job_id, key, value in session.execute(
            select(JobLabel.job_id, JobLabel.key, JobLabel.value).where(JobLabel.job_id.in_(ids))
        ):
            labels[job_id][key] = value
        for run in session.execute(
            select(*_RUN_COLUMNS).where(StageRun.job_id.in_(ids)).order_by(StageRun.started_at, StageRun.attempt)
        ):
            runs[run.job_id].append(run)
        for publication in session.execute(
            select(*_PUBLICATION_COLUMNS).where(Publication.job_id.in_(ids)).order_by(Publication.created_at)
        ):
            publications[publication.job_id].append(publication)
    result = []
    for job in jobs:
        job_runs = runs[job.id]
        current = next((r for r in reversed(job_runs) if r.stage == job.stage), None)
        result.append(
            JobOut(
                id=job.id,
                status=job.status,  # type: ignore[arg-type]
                stage=job.stage,
                stage_progress=current.progress if current else None,
                name=job.name,
                labels=dict(sorted(labels[job.id].items())),
                spec=load_stored_spec(job.spec),
                error=JobError(code=job.error_code, message=job.error_message or "", stage=job.error_stage)
                if job.error_code
                else None,
                cancel_requested=job.cancel_requested_at is not None,
                resume_count=job.resume_count,
                run_attempts=job.run_attempts,
                created_at=job.created_at,
                updated_at=job.updated_at,
                started_at=job.started_at,
                finished_at=job.finished_at,
                stages=[StageRunOut.model_validate(run, from_attributes=True) for run in job_runs],
                publications=[PublicationOut.model_validate(p, from_attributes=True) for p in publications[job.id]],
            )
        )
    return result


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
