"""A job's artifacts: the one lookup by name, and the one list of a job's artifacts.

An artifact is named by its path inside the job's export (`drafter/config.json`, `manifest.json`, ...), unique per
job. Every reader that takes a name (the download routes, the dashboard's links and inline reads, the worker's
drafter records, registering an artifact again) finds the row through `artifact_named`, so all of them agree on
what a name means; tests/test_layout.py bans comparing `Artifact.name` outside domain/. Every reader of a job's
whole set (the API's list, the `job.succeeded` webhook's rollout summary, the publish stage, a published drafter's
fetch) reads `artifacts_of`.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from domain.models import Artifact


def artifact_named(session: Session, job_id: str, name: str) -> Artifact | None:
    """The artifact `name` of job `job_id`, or None. The caller has already checked that the job is the
    caller's (an organisation's job, a worker's own)."""
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))


def artifacts_of(session: Session, job_id: str) -> list[Artifact]:
    """Every artifact of job `job_id`, by name. The caller has already checked that the job is the caller's."""
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.name)))
