"""Response bodies built from domain rows: the HTTP layer's view of jobs, drafters and audits.

The domain (domain/jobs.py, domain/job_reads.py, domain/drafters.py, domain/audits.py) returns rows; the response
models live in api/schemas.py, but for two that one route module defines and returns itself (`SecretOut` in
routes/secrets.py, `UsageOut` in routes/usage.py). This module is not the only place that shapes bodies: it turns
a job, a drafter or an audit into its body, because several routes return each of them (a job from create, list,
get, cancel and resume). A body that only one route module returns is shaped in that module, next to its route:
files (`_file_out`), artifacts, events and metrics (job_data.py), webhooks and their deliveries (webhooks.py
`_out`), secrets (secrets.py `_out`), usage, and health and readiness (health.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from api.schemas import (
    AuditError,
    AuditOut,
    DrafterDetail,
    DrafterLink,
    DrafterOut,
    JobOut,
)
from domain.db import Connection, Session
from domain.drafters import drafter_chain, publications_by_job
from domain.job_reads import job_children
from domain.jobs import load_stored_spec, load_stored_spec_text
from domain.models import Audit, Drafter
from domain.statuses import job_status_text
from schemas.job_spec import JobSpec


def _spec(job: Any) -> JobSpec:
    text = getattr(job, "spec_text", None)  # a row of domain.job_reads.JOB_COLUMNS; an entity has `spec`
    return load_stored_spec_text(text) if text is not None else load_stored_spec(job.spec)


def jobs_to_out(db: Session | Connection, jobs: list[Any]) -> list[JobOut]:
    """Response bodies of jobs (Job entities, or rows of domain.job_reads.JOB_COLUMNS) with one extra query in total
    for their labels, stage runs and publications (domain/job_reads.py `job_children`)."""
    runs, publications, labels = job_children(db, [job.id for job in jobs])
    bodies = []
    for job in jobs:
        job_runs = runs[job.id]
        current = next((r for r in reversed(job_runs) if r["stage"] == job.stage), None)
        bodies.append({
            "id": job.id,
            "status": job.status,
            "status_text": job_status_text(job.status),
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
