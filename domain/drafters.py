"""Published drafters and their lineage.

Every succeeded job publishes one drafter; the worker records it in the publish stage
(domain/runs.py `record_drafter`, which calls `upsert_drafter` here) with its lineage:

    target       URI as submitted, the exact revision fetched (Hub commit, S3 digest), fingerprint
    data         the prompts source and its revision, the regenerated set's size and where it is stored
    parent       the drafter a warm start began from (an id of the organisation, or a URI)
    recipe       the job spec's drafter, training, sampling and validation sections
    code         the Draftsmith version (and git commit, when known) and package versions the train stage ran

and its validation metrics (tau per position and category, the lossless verdict, speedup, the parent's tau on
the same target when warm-started). `GET /v1/drafters` lists an organisation's drafters, `GET
/v1/drafters/{id}` shows one with its chain of parents. A warm start or an audit names a drafter by its id;
another organisation's id answers 404, exactly like a missing one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from domain.artifacts import artifacts_of
from domain.errors import FieldError, InvalidRequest, NotFound
from domain.models import Drafter, Job, Publication, utcnow
from domain.statuses import JobStatus
from schemas.job_spec import DRAFTER_ID_RE, JobSpec
from schemas.lineage import VARIANT_UPGRADES, WARM_START_KEEPS, DrafterLineage, DrafterMetrics, DrafterShape

MAX_CHAIN = 100
def published_drafter(session: Session, org_id: str, drafter_id: str) -> Drafter | None:
    """The organisation's drafter `drafter_id` if its job succeeded (a drafter is published only then), else None."""
    return session.scalar(select(Drafter).join(Job, Job.id == Drafter.job_id).where(
        Drafter.id == drafter_id, Drafter.org_id == org_id, Job.status == str(JobStatus.SUCCEEDED)))


def get_drafter_for_org(session: Session, org_id: str, drafter_id: str, *, field: str | None = None) -> Drafter:
    """The drafter, if it belongs to `org_id` (and its job succeeded); otherwise 404, like a missing one."""
    row = published_drafter(session, org_id, drafter_id) if DRAFTER_ID_RE.match(drafter_id) else None
    if row is None:
        raise NotFound(f"no drafter {drafter_id!r} in your organisation" + (f" ({field})" if field else "")
                       + "; GET /v1/drafters lists yours")
    return row


def check_warm_start(session: Session, org_id: str, spec: JobSpec) -> Drafter | None:
    """At submit: a warm start from a drafter id must name one of the organisation's drafters (404 otherwise)
    that the job's shape can start from (422 naming the field): the same depth and mask token, and a variant the
    parent's is or upgrades to (schemas/lineage.py); block size and taps are mapped by the worker. URIs are
    checked by the worker, which fetches them."""
    if spec.init is None or not spec.init.from_drafter.startswith("drf_"):
        return None
    parent = get_drafter_for_org(session, org_id, spec.init.from_drafter, field="init.from_drafter")
    errors = []
    if spec.drafter.variant != parent.variant and (parent.variant, spec.drafter.variant) not in VARIANT_UPGRADES:
        errors.append(FieldError(field="drafter.variant", message=(
            f"{spec.drafter.variant!r} cannot start from the parent drafter {parent.id}, a {parent.variant!r} one: "
            f"set drafter.variant to {parent.variant!r}, or drop init to train from scratch")))
    shape = DrafterShape.read(parent.config)
    for attribute in WARM_START_KEEPS:
        field = f"drafter.{attribute}"
        wanted = getattr(spec.drafter, attribute)
        had = getattr(parent, attribute, None) if attribute == "num_layers" else getattr(shape, attribute)
        if wanted is not None and had is not None and wanted != had:
            errors.append(FieldError(field=field, message=f"{wanted!r} differs from the parent drafter {parent.id}'s "
                                                          f"{had!r}; a warm start keeps it: set {field} to {had!r} "
                                                          "(or leave it unset), or drop init to train from scratch"))
    if errors:
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors)
    return parent


def upsert_drafter(session: Session, job: Job, spec: JobSpec, *, target_revision: str | None,
                   target_fingerprint: str, config: DrafterShape | Mapping[str, Any],
                   metrics: DrafterMetrics | Mapping[str, Any], lineage: DrafterLineage | Mapping[str, Any],
                   manifest_sha256: str) -> Drafter:
    """The job's drafter (recording it again replaces the record: a rerun of publish); `spec` is the job's stored
    spec (domain/jobs.py `load_stored_spec`). Does not commit. The three JSON columns are stored through their
    models (schemas/lineage.py), read leniently when given as objects."""
    if not re.fullmatch(r"[0-9a-f]{64}", manifest_sha256):
        raise ValueError("manifest_sha256 must be 64 lowercase hex characters")
    job_id = job.id
    measured = DrafterMetrics.read(metrics)
    parent_ref = spec.init.from_drafter if spec.init else None
    parent_id = None
    if parent_ref and DRAFTER_ID_RE.match(parent_ref):
        parent_id = session.scalar(select(Drafter.id).where(Drafter.id == parent_ref, Drafter.org_id == job.org_id))
    row = session.scalar(select(Drafter).where(Drafter.job_id == job_id))
    if row is None:
        row = Drafter(job_id=job_id, org_id=job.org_id)
        session.add(row)
    row.parent_id, row.parent_ref, row.name = parent_id, parent_ref, job.name
    row.target_uri, row.target_revision, row.target_fingerprint = spec.target.uri, target_revision, target_fingerprint
    row.variant, row.block_size, row.num_layers = spec.drafter.variant, spec.drafter.block_size, spec.drafter.num_layers
    row.tau = measured.tau
    row.lossless = bool(measured.lossless_passed)
    row.config, row.metrics = DrafterShape.read(config).to_json(), measured.to_json()
    row.lineage, row.manifest_sha256 = DrafterLineage.read(lineage).to_json(), manifest_sha256
    row.created_at = utcnow()
    session.flush()
    return row


def list_drafters(session: Session, org_id: str, *, limit: int, after: str | None,
                  target_fingerprint: str | None = None, target_uri: str | None = None,
                  job_id: str | None = None) -> tuple[list[Drafter], bool]:
    query = select(Drafter).join(Job, Job.id == Drafter.job_id).where(Drafter.org_id == org_id,
                                                                       Job.status == str(JobStatus.SUCCEEDED))
    if target_fingerprint:
        query = query.where(Drafter.target_fingerprint == target_fingerprint)
    if target_uri:
        query = query.where(Drafter.target_uri == target_uri)
    if job_id:
        query = query.where(Drafter.job_id == job_id)
    if after is not None:
        query = query.where(Drafter.id < after)
    rows = list(session.scalars(query.order_by(Drafter.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def publications_by_job(session: Session, job_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Where each job's artifacts were published, oldest first (the drafter's `publications`)."""
    found: dict[str, list[dict[str, Any]]] = {job_id: [] for job_id in job_ids}
    if job_ids:
        for p in session.scalars(select(Publication).where(Publication.job_id.in_(job_ids))
                                 .order_by(Publication.created_at)):
            found[p.job_id].append({"kind": p.kind, "location": p.location, "revision": p.revision, "url": p.url})
    return found


def drafter_chain(session: Session, org_id: str, drafter_id: str) -> tuple[Drafter, list[Drafter]]:
    """The organisation's drafter and its chain: itself, its parent, the parent's parent... oldest last."""
    row = get_drafter_for_org(session, org_id, drafter_id)
    chain: list[Drafter] = []
    seen: set[str] = set()
    current: Drafter | None = row
    while current is not None and current.id not in seen and len(chain) < MAX_CHAIN:
        seen.add(current.id)
        chain.append(current)
        current = session.scalar(select(Drafter).where(Drafter.id == current.parent_id, Drafter.org_id == org_id)) \
            if current.parent_id else None
    return row, chain


def rollout_summary(session: Session, job: Job) -> dict[str, Any] | None:
    """What a deployment system needs to roll a succeeded job's drafter out (webhook `job.succeeded`): the
    drafter id and parent, the target it is for, the lossless verdict and acceptance, the serving settings, every
    artifact with its sha256, and where it was published."""
    row = session.scalar(select(Drafter).where(Drafter.job_id == job.id))
    if row is None:
        return None
    artifacts = [{"name": a.name, "kind": a.kind, "sha256": a.sha256, "size_bytes": a.size_bytes,
                  "download_path": f"/v1/jobs/{job.id}/artifacts/{a.name}"}
                 for a in artifacts_of(session, job.id)]
    metrics = DrafterMetrics.read(row.metrics)
    return {
        "id": row.id, "parent": {"id": row.parent_id, "ref": row.parent_ref} if row.parent_ref else None,
        "target": {"uri": row.target_uri, "revision": row.target_revision, "fingerprint": row.target_fingerprint},
        "lossless": {"passed": row.lossless, "greedy_mismatches": metrics.greedy_mismatches,
                     "sampling_p_value": metrics.sampling_p_value},
        "tau": row.tau, "parent_tau": metrics.parent_tau, "block_size": row.block_size,
        "recommended_block_size": metrics.recommended_block_size,
        "serving": metrics.serving.to_json() if metrics.serving else None,
        "manifest_sha256": row.manifest_sha256, "artifacts": artifacts,
        "publications": publications_by_job(session, [job.id])[job.id],
    }
