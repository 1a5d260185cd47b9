"""Drift audits: `POST /v1/audits` measures an existing drafter against a (new) target checkpoint.

An audit is a small job of its own: a row in `audits` (the truth), handed to the worker by task name
(`draftsmith.run_audit(audit_id)` on the gpu queue), run by `worker/audits.py` through the trainer's
`trainer.audit.run_audit` (the function `draftsmith audit` runs locally), its result stored on the row.

    queued -> running -> succeeded (result + recommendation) | failed (error code + message)
    queued -> cancelled                      (POST /v1/audits/{id}/cancel: the worker's claim then finds nothing)
    running -> cancelling -> cancelled       (the worker's heartbeat sees it and stops the measurement)

Admission resolves every default into the stored spec (schemas/audit.py): for a drafter id of the organisation,
the prompts, sampling parameters and validation settings of the job that trained it and its recorded tau as
the reference; the organisation's thresholds. Another organisation's drafter id is a 404. Quotas apply
(domain/usage.py), and an active audit takes a slot of the organisation's active-work limit, counted with its jobs
under the same organisation lock (domain/jobs.py lock_org_and_count_active). A worker that dies mid-audit stops
heartbeating; `take_over_stale_audits` puts the audit back in the queue (at most `MAX_ATTEMPTS` times).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from domain.db import execute_dml, lock_briefly
from domain.drafters import get_drafter_for_org
from domain.errors import InvalidTransition, NotFound, ServiceUnavailable
from domain.files import uploaded_prompt_count
from domain.jobs import load_stored_spec, lock_org_and_count_active, parse_spec, refuse_if_full
from domain.keys import get_organisation
from domain.models import Audit, Job, Organisation, new_id, utcnow
from domain.queue import CeleryQueue, RecordingQueue
from domain.redaction import redact_text
from domain.settings import Settings
from domain.statuses import AuditStatus
from domain.storage_scope import check_spec_storage
from domain.usage import check_quota
from schemas.audit import AuditResult, AuditSpec, AuditThresholds, resolved

log = logging.getLogger("draftsmith.api")
MAX_ATTEMPTS = 3
AUDIT_ID_PREFIX = "aud_"


def parse_audit_spec(raw: bytes, settings: Settings) -> AuditSpec:
    return parse_spec(raw, settings, AuditSpec, '{"drafter": "drf_...", "target": {"uri": "..."}}')


def organisation_thresholds(org: Organisation) -> AuditThresholds:
    return AuditThresholds.model_validate(org.audit_thresholds) if org.audit_thresholds else AuditThresholds()


def audit_thresholds_of(session: Session, org_id: str) -> AuditThresholds:
    return organisation_thresholds(get_organisation(session, org_id))


def set_audit_thresholds(session: Session, org_id: str, thresholds: AuditThresholds) -> AuditThresholds:
    """The organisation's own rule for keep / warm start / retrain, for audits created from now on; committed."""
    get_organisation(session, org_id).audit_thresholds = thresholds.model_dump(mode="json")
    session.commit()
    return thresholds


def create_audit(session: Session, settings: Settings, queue: RecordingQueue | CeleryQueue, *, org_id: str, spec: AuditSpec) -> Audit:
    defaults: dict[str, Any] = {"thresholds": audit_thresholds_of(session, org_id)}
    drafter_id = None
    if spec.drafter.startswith("drf_"):
        drafter = get_drafter_for_org(session, org_id, spec.drafter, field="drafter")
        drafter_id = drafter.id
        stored = session.scalar(select(Job.spec).where(Job.id == drafter.job_id))
        job_spec = load_stored_spec(stored) if stored else None
        defaults.update(
            sampling=job_spec.sampling if job_spec else None, data=job_spec.data if job_spec else None,
            validation=job_spec.validation if job_spec else None, reference_tau=drafter.tau)
    if spec.data is not None and spec.data.source.startswith("file-"):
        uploaded_prompt_count(session, org_id, spec.data.source)  # 422 unless it is one of the org's files
    full = resolved(spec, **defaults)
    check_spec_storage(session, settings, org_id, full)  # the drafter, target and prompts: only the org's own
    org, active = lock_org_and_count_active(session, org_id)  # held until the insert commits: no burst gets past
    refuse_if_full(org, active, settings)
    check_quota(session, org, settings, what="audit")
    row = Audit(id=new_id(AUDIT_ID_PREFIX), org_id=org_id, status=str(AuditStatus.QUEUED),
                spec=full.model_dump(mode="json"), drafter_ref=spec.drafter, drafter_id=drafter_id,
                target_uri=spec.target.uri, attempts=0)
    session.add(row)
    session.commit()
    try:
        queue.enqueue_audit(row.id)
    except Exception as exc:  # the broker is down: the audit exists, nobody will run it
        log.exception("could not enqueue audit %s", row.id)
        session.rollback()
        reloaded = session.get(Audit, row.id, populate_existing=True)
        assert reloaded is not None
        row = reloaded
        row.status, row.finished_at = str(AuditStatus.FAILED), utcnow()
        row.error_code, row.error_message = "enqueue_failed", f"broker unavailable: {redact_text(str(exc))}"[:2000]
        session.commit()
        raise ServiceUnavailable(f"audit {row.id} was saved but the broker is unavailable; submit it again once the "
                                 "broker is back", retry_after_seconds=30, extra={"audit_id": row.id}) from None
    return row


def get_audit_for_org(session: Session, org_id: str, audit_id: str, *, lock: bool = False) -> Audit:
    query = select(Audit).where(Audit.id == audit_id, Audit.org_id == org_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"no audit {audit_id!r} in your organisation")
    return row


def cancel_audit(session: Session, org_id: str, audit_id: str) -> Audit:
    """A queued audit ends cancelled at once (the worker's claim then finds nothing to run); a running one becomes
    `cancelling` until its worker notices at the next heartbeat and stops. Cancelling twice is not an error.

    Every branch ends its transaction (commit, or rollback when it raises) before it returns, and the row is locked
    only when there is something to change, briefly: as domain/jobs.py cancel_job, for the same reason."""
    try:
        # A column, not the object: the locked read below must load the row fresh, not find a copy from before.
        status = session.scalar(select(Audit.status).where(Audit.id == audit_id, Audit.org_id == org_id))
        if status is None:
            raise NotFound(f"no audit {audit_id!r} in your organisation")
        if _audit_cancel_is_noop(audit_id, status):
            row = get_audit_for_org(session, org_id, audit_id)
            session.commit()
            return row
        lock_briefly(session)
        row = get_audit_for_org(session, org_id, audit_id, lock=True)
        if not _audit_cancel_is_noop(audit_id, row.status):  # another request may have cancelled it while we waited
            if row.status == AuditStatus.QUEUED:
                row.status, row.finished_at = str(AuditStatus.CANCELLED), utcnow()
            else:
                row.status = str(AuditStatus.CANCELLING)
        session.commit()
        return row
    except BaseException:
        session.rollback()
        raise


def _audit_cancel_is_noop(audit_id: str, status: str) -> bool:
    """True when the audit is already cancelling or cancelled; refuses a finished one."""
    if status in (AuditStatus.SUCCEEDED, AuditStatus.FAILED):
        raise InvalidTransition(f"audit {audit_id} already {status}; there is nothing to cancel",
                                extra={"audit_status": status})
    return status in (AuditStatus.CANCELLING, AuditStatus.CANCELLED)


def list_audits(session: Session, org_id: str, *, limit: int, after: str | None, drafter: str | None = None
                ) -> tuple[list[Audit], bool]:
    query = select(Audit).where(Audit.org_id == org_id)
    if drafter:
        query = query.where(or_(Audit.drafter_ref == drafter, Audit.drafter_id == drafter))
    if after is not None:
        query = query.where(Audit.id < after)
    rows = list(session.scalars(query.order_by(Audit.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


# --- the worker's side (each commits) -------------------------------------------------------------------


def claim_audit(session: Session, audit_id: str, worker_id: str) -> Audit | None:
    """queued -> running for this worker; None when the audit is not queued (done, running elsewhere, gone)."""
    now = utcnow()
    claimed = execute_dml(session,
        update(Audit).where(Audit.id == audit_id, Audit.status == str(AuditStatus.QUEUED))
        .values(status=str(AuditStatus.RUNNING), worker_id=worker_id, started_at=now, heartbeat_at=now,
                attempts=Audit.attempts + 1)
        .execution_options(synchronize_session=False)).rowcount
    session.commit()
    return session.get(Audit, audit_id, populate_existing=True) if claimed else None


def audit_heartbeat(session: Session, audit_id: str, worker_id: str) -> bool:
    """Keep this worker's attempt visibly alive. False when the worker should stop: a cancellation was requested
    (the beat goes on, so the reaper leaves the audit to its live worker), or the audit is no longer this worker's."""
    alive = (str(AuditStatus.RUNNING), str(AuditStatus.CANCELLING))
    beat = execute_dml(session, update(Audit).where(Audit.id == audit_id, Audit.status.in_(alive),
                                               Audit.worker_id == worker_id)
                           .values(heartbeat_at=utcnow()).execution_options(synchronize_session=False)).rowcount
    session.commit()
    if not beat:
        return False
    return session.scalar(select(Audit.status).where(Audit.id == audit_id)) == AuditStatus.RUNNING


def acknowledge_audit_cancellation(session: Session, audit_id: str, worker_id: str | None = None) -> bool:
    """cancelling -> cancelled, by the worker that stopped (or, `worker_id` None, the reaper for a dead one)."""
    query = update(Audit).where(Audit.id == audit_id, Audit.status == str(AuditStatus.CANCELLING))
    if worker_id is not None:
        query = query.where(Audit.worker_id == worker_id)
    done = execute_dml(session, query.values(status=str(AuditStatus.CANCELLED), finished_at=utcnow())
                           .execution_options(synchronize_session=False)).rowcount
    session.commit()
    return done > 0


def finish_audit(session: Session, audit_id: str, worker_id: str, result: AuditResult, *,
                 target_revision: str | None) -> bool:
    done = execute_dml(session,
        update(Audit).where(Audit.id == audit_id, Audit.status == str(AuditStatus.RUNNING),
                            Audit.worker_id == worker_id)
        .values(status=str(AuditStatus.SUCCEEDED), result=result.to_json(), recommendation=result.action,
                target_revision=target_revision, finished_at=utcnow(), error_code=None, error_message=None)
        .execution_options(synchronize_session=False)).rowcount
    session.commit()
    if not done:  # cancelled while the last prompts ran: the user's request wins over the result
        acknowledge_audit_cancellation(session, audit_id, worker_id)
    return done > 0


def fail_audit(session: Session, audit_id: str, worker_id: str, *, code: str, message: str,
               target_revision: str | None = None) -> bool:
    done = execute_dml(session,
        update(Audit).where(Audit.id == audit_id, Audit.status == str(AuditStatus.RUNNING),
                            Audit.worker_id == worker_id)
        .values(status=str(AuditStatus.FAILED), error_code=code[:64], error_message=message[:10_000],
                finished_at=utcnow(), target_revision=target_revision)
        .execution_options(synchronize_session=False)).rowcount
    session.commit()
    if not done:  # cancelled meanwhile: it ends cancelled, not failed
        acknowledge_audit_cancellation(session, audit_id, worker_id)
    return done > 0


def take_over_stale_audits(session: Session, stale_after_seconds: float) -> list[str]:
    """Running audits without a heartbeat for `stale_after_seconds`: queued again (one caller wins each), or failed
    after MAX_ATTEMPTS; cancelling ones whose worker went quiet end cancelled. Returns the ids to enqueue."""
    cutoff: datetime = utcnow() - timedelta(seconds=stale_after_seconds)
    quiet = or_(Audit.heartbeat_at < cutoff, Audit.heartbeat_at.is_(None))
    session.execute(update(Audit).where(Audit.status == str(AuditStatus.CANCELLING), quiet)
                    .values(status=str(AuditStatus.CANCELLED), finished_at=utcnow())
                    .execution_options(synchronize_session=False))
    session.commit()
    stale = session.execute(
        select(Audit.id, Audit.attempts).where(Audit.status == str(AuditStatus.RUNNING), quiet)).all()
    requeue = []
    for audit_id, attempts in stale:
        if attempts >= MAX_ATTEMPTS:
            values = {"status": str(AuditStatus.FAILED), "error_code": "worker_lost", "finished_at": utcnow(),
                      "error_message": f"the worker went quiet {attempts} times; submit the audit again"}
        else:
            values = {"status": str(AuditStatus.QUEUED), "worker_id": None}
        claimed = execute_dml(session,
            update(Audit).where(Audit.id == audit_id, Audit.status == str(AuditStatus.RUNNING), quiet)
            .values(**values).execution_options(synchronize_session=False)).rowcount
        session.commit()
        if claimed and values["status"] == AuditStatus.QUEUED:
            requeue.append(audit_id)
    return requeue


def record_audit_usage(session: Session, audit_id: str, *, compute_seconds: float, tokens_generated: int) -> None:
    from domain.usage import append_usage

    org_id = session.scalar(select(Audit.org_id).where(Audit.id == audit_id))
    if org_id is None:
        raise NotFound(f"no audit {audit_id!r}")
    append_usage(session, org_id, audit_id=audit_id, compute_seconds=compute_seconds,
                 tokens_generated=tokens_generated)
    session.commit()
