"""Job admission and the user-facing job operations (create, get, cancel, resume; the reads that build response
bodies, lists included, are domain/job_reads.py).

Admission order matters and is the same on both databases:
1. lock the organisation row (an UPDATE: row lock on PostgreSQL, write lock on SQLite), so two
   creates for one organisation are serialised;
2. replay an earlier job with the same Idempotency-Key (same body) or refuse a different body;
3. refuse when the organisation's active work (jobs and drift audits, which share the GPU queue) has reached
   its limit;
4. insert, commit, and only then enqueue, so the worker never receives an id it cannot read.
If enqueueing fails the committed job is marked failed (`enqueue_failed`) and can be resumed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from domain.db import lock_briefly
from domain.drafters import check_warm_start
from domain.errors import (
    FieldError,
    IdempotencyConflict,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    ServiceUnavailable,
    TooManyActiveJobs,
    field_errors_from_pydantic,
)
from domain.events import append_event
from domain.files import uploaded_prompt_count
from domain.keys import lock_organisation
from domain.models import Audit, Job, JobLabel, Organisation, StageRun, new_id, utcnow
from domain.queue import CeleryQueue, RecordingQueue
from domain.redaction import redact_text
from domain.secrets import check_referenced_secrets
from domain.settings import Settings
from domain.states import ACTIVE_STATUSES, STAGE_ORDER, JobStatus, Stage, transition
from domain.statuses import AUDIT_ACTIVE_STATUSES, StageRunStatus
from domain.storage_scope import StorageScopeError, check_spec_storage, refuse_link_loops, spec_storage_uris
from domain.usage import check_quota
from schemas.audit import AuditSpec
from schemas.bounds import JsonInputError, file_uri_path, loads_json
from schemas.job_spec import ADAPTER_CONFIG, JobSpec

log = logging.getLogger("draftsmith.api")
_IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")
JOB_ID_RE = re.compile(r"^job_[0-9A-Z]{26}$")
SpecT = TypeVar("SpecT", JobSpec, AuditSpec)


def parse_spec(raw: bytes, settings: Settings, model: type[SpecT], example: str) -> SpecT:
    """Validate a request body as `model` (a job or audit spec) with this deployment's rules; errors name each
    field. `example` is the smallest valid body, shown when the body is not a JSON object."""
    try:
        body = loads_json(raw or b"null")  # bounded: depth, 64-bit numbers, no NaN, UTF-8 only
    except JsonInputError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}", errors=[FieldError(field="body", message=str(exc))]) from exc
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body must be a JSON object, e.g. {example}",
                             errors=[FieldError(field="body", message="expected a JSON object")])
    try:
        spec = model.model_validate(body, context={"allowed_file_roots": settings.allowed_file_roots})
    except ValidationError as exc:
        errors = field_errors_from_pydantic(list(exc.errors(include_url=False)), model=model)
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors) from None
    loops = []
    for item in spec_storage_uris(spec):
        if item.uri.startswith("file://"):
            try:
                refuse_link_loops(item.uri)
            except StorageScopeError as exc:
                loops.append(FieldError(field=item.field, message=str(exc)))
    if loops:
        raise InvalidRequest(f"{loops[0].field}: {loops[0].message}", errors=loops)
    if (spec.target.base is None and spec.target.uri.startswith("file://")
            and os.path.isfile(os.path.join(file_uri_path(spec.target.uri), ADAPTER_CONFIG))):
        # An adapter this process can see needs its base named now; one it cannot see is refused at prepare, the
        # same way. What the adapter's own config names is never read.
        message = ("the target is a LoRA adapter folder: set target.base to the URI of the base model it was "
                   "trained on (the base_model_name_or_path in its adapter_config.json is never opened)")
        raise InvalidRequest(f"target.base: {message}", errors=[FieldError(field="target.base", message=message)])
    if spec.target.trust_remote_code and not settings.allow_trust_remote_code:
        message = (
            "this deployment does not run code shipped with checkpoints; remove trust_remote_code "
            "or ask the operator to set DRAFTSMITH_ALLOW_TRUST_REMOTE_CODE=true"
        )
        raise InvalidRequest(message, errors=[FieldError(field="target.trust_remote_code", message=message)])
    return spec


def parse_job_spec(raw: bytes, settings: Settings) -> JobSpec:
    return parse_spec(raw, settings, JobSpec, '{"target": {"uri": "bundled:smollm2-135m"}}')


def load_stored_spec(stored: dict[str, Any]) -> JobSpec:
    # Stored specs passed admission already; file roots may have changed since, so don't re-judge them.
    return JobSpec.model_validate(stored, context={"allowed_file_roots": ["/"]})


@functools.lru_cache(maxsize=1024)
def load_stored_spec_text(text: str) -> JobSpec:
    """`load_stored_spec` of a spec read as its JSON text (domain/job_reads.py `JOB_COLUMNS`' `spec_text`),
    remembered by that text.

    Keyed by the whole text, so it cannot answer for a changed spec: the same text always parses to the same dict,
    which validates to the same (frozen) JobSpec (the `/` root makes the file-root checks independent of the
    filesystem). A job read then costs no JSON parse and no validation of its spec (otherwise a page of 20 jobs
    validates 20 specs per request)."""
    return load_stored_spec(json.loads(text))


def get_job_for_org(session: Session, org_id: str, job_id: str, *, lock: bool = False) -> Job:
    """The job, if it belongs to `org_id`; otherwise 404, the same answer as for a missing id."""
    query = select(Job).where(Job.id == job_id, Job.org_id == org_id)
    if lock:
        query = query.with_for_update()
    job = session.scalar(query)
    if job is None:
        raise NotFound(f"no job {job_id!r} in your organisation")
    return job


def job_by_id(session: Session, job_id: str, *, detach: bool = False) -> Job | None:
    """The job row read afresh (a long-lived session's copy is refreshed), or None. `detach`: taken out of
    `session`, so that it can be read after the session closes (its columns are loaded: expire_on_commit is off)."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is not None and detach:
        session.expunge(job)
    return job


def next_stage(session: Session, job_id: str) -> Stage | None:
    """The first stage without a succeeded attempt: where a new or resumed job continues."""
    done = set(session.scalars(select(StageRun.stage).where(
        StageRun.job_id == job_id, StageRun.status == str(StageRunStatus.SUCCEEDED))))
    return next((stage for stage in STAGE_ORDER if stage not in done), None)


def _check_idempotency_key(key: str | None) -> None:
    if key is not None and not _IDEMPOTENCY_KEY_RE.match(key):
        raise InvalidRequest(
            "Idempotency-Key must be 1-255 printable ASCII characters without spaces (a UUID works well)",
            errors=[FieldError(field="Idempotency-Key", message="1-255 printable ASCII characters, no spaces")],
        )



@dataclass
class ActiveWork:
    jobs: int
    audits: int

    @property
    def total(self) -> int:
        return self.jobs + self.audits


def lock_org_and_count_active(session: Session, org_id: str) -> tuple[Organisation, ActiveWork]:
    """Serialise admissions (jobs, resumes and audits) for one organisation until commit, and count its active work.
    Audits count too: each is a GPU task, and without a limit a burst of them filled the queue."""
    org = lock_organisation(session, org_id)
    jobs = session.scalar(
        select(func.count()).select_from(Job).where(Job.org_id == org_id, Job.status.in_(list(ACTIVE_STATUSES)))
    )
    audits = session.scalar(
        select(func.count()).select_from(Audit).where(Audit.org_id == org_id,
                                                     Audit.status.in_(AUDIT_ACTIVE_STATUSES))
    )
    return org, ActiveWork(int(jobs or 0), int(audits or 0))


def refuse_if_full(org: Organisation, active: ActiveWork, settings: Settings) -> None:
    limit = org.max_concurrent_jobs or settings.default_max_concurrent_jobs
    if active.total >= limit:
        raise TooManyActiveJobs(
            f"organisation {org.name!r} already has {active.jobs} active jobs and {active.audits} active audits "
            f"(limit {limit}, counted together); wait for one to finish or cancel one "
            "(POST /v1/jobs/{id}/cancel or /v1/audits/{id}/cancel), then retry",
            retry_after_seconds=60,
            extra={"active_jobs": active.jobs, "active_audits": active.audits, "limit": limit},
        )


def check_job_spec(session: Session, settings: Settings, org_id: str, spec: JobSpec) -> int | None:
    """Every refusal of a spec that depends on the organisation, for job creation and the estimate alike (one
    function, so an estimate is never given for a job that would be refused): its uploaded file, the secrets it
    names, its URIs, its warm start. Returns the uploaded file's prompt count (data.source = file-...), else None."""
    uploaded = uploaded_prompt_count(session, org_id, spec.data.source) if spec.data.source.startswith("file-") \
        else None
    check_referenced_secrets(session, org_id, spec)  # publish[].credentials_secret / token_secret it has stored
    check_spec_storage(session, settings, org_id, spec)  # URIs into Draftsmith's own storage: only the org's own
    check_warm_start(session, org_id, spec)  # another organisation's drafter: 404; another shape: 422
    return uploaded


@dataclass
class CreatedJob:
    job: Job
    replayed: bool


def create_job(
    session: Session,
    settings: Settings,
    queue: RecordingQueue | CeleryQueue,
    *,
    org_id: str,
    spec: JobSpec,
    idempotency_key: str | None,
) -> CreatedJob:
    _check_idempotency_key(idempotency_key)
    request_hash = hashlib.sha256(spec.canonical_json().encode()).hexdigest()
    check_job_spec(session, settings, org_id, spec)
    org, active = lock_org_and_count_active(session, org_id)  # before the idempotency lookup
    if idempotency_key is not None:
        existing = session.scalar(select(Job).where(Job.org_id == org_id, Job.idempotency_key == idempotency_key))
        if existing is not None:
            known_id, known_hash = existing.id, existing.request_hash
            session.rollback()  # release the organisation lock: nothing is written on a replay
            if known_hash != request_hash:
                raise IdempotencyConflict(
                    f"Idempotency-Key {idempotency_key!r} was used for job {known_id} with a different body; "
                    "use a new key for a different job",
                    extra={"job_id": known_id},
                )
            return CreatedJob(existing, replayed=True)
    refuse_if_full(org, active, settings)
    check_quota(session, org, settings, what="job")

    job = Job(
        id=new_id("job_"), org_id=org_id, status=str(JobStatus.QUEUED), name=spec.name, spec=spec.model_dump(mode="json"),
        idempotency_key=idempotency_key, request_hash=request_hash,
    )
    session.add(job)
    session.add_all(JobLabel(job_id=job.id, key=k, value=v) for k, v in spec.labels.items())
    try:
        session.flush()
    except IntegrityError:
        # Only the (org, idempotency_key) constraint can collide here: another request won the race.
        session.rollback()
        existing = session.scalar(select(Job).where(Job.org_id == org_id, Job.idempotency_key == idempotency_key))
        if existing is None:
            raise
        if existing.request_hash != request_hash:
            raise IdempotencyConflict(f"Idempotency-Key {idempotency_key!r} is in use with a different body") from None
        return CreatedJob(existing, replayed=True)
    append_event(session, job, "job.created", f"job created; target {spec.target.uri}")
    session.commit()
    _enqueue_or_fail(session, queue, job, Stage.PREPARE)
    return CreatedJob(job, replayed=False)


def _enqueue_or_fail(session: Session, queue: RecordingQueue | CeleryQueue, job: Job, stage: Stage | None) -> None:
    try:
        queue.enqueue_job(job.id, stage or Stage.PUBLISH)
    except Exception as exc:  # any broker error: the job exists but nobody will run it
        log.exception("could not enqueue %s", job.id)
        session.rollback()
        reloaded = session.get(Job, job.id, populate_existing=True)
        assert reloaded is not None
        job = reloaded
        message = f"broker unavailable: {redact_text(str(exc))}"[:2000]  # a broker URL may carry a password
        job.error_code, job.error_message, job.error_stage = "enqueue_failed", message, None
        transition(session, job, JobStatus.FAILED, reason="could not hand the job to the broker")
        session.commit()
        raise ServiceUnavailable(
            f"job {job.id} was saved but the broker is unavailable; it is marked failed "
            f"(enqueue_failed). Resume it with POST /v1/jobs/{job.id}/resume once the broker is back",
            retry_after_seconds=30,
            extra={"job_id": job.id},
        ) from None


def cancel_job(session: Session, org_id: str, job_id: str) -> Job:
    """Cancel the job; cancelling a cancelling or cancelled job changes nothing, a finished one is refused.

    Every branch ends its transaction (commit, or rollback when it raises) before it returns: a caller may take a
    while to answer, and a row lock held meanwhile made every other cancel of the job wait, each on a worker
    thread, until none was left to finish the first (20 concurrent cancels of a cancelled job hung the process).
    The row is locked only when there is something to change, and not waited for longer than lock_briefly allows."""
    try:
        # A column, not the object: this read must not put a copy of the job in the session that the locked read
        # below would return unrefreshed (it may be stale by the time the lock is granted).
        status = session.scalar(select(Job.status).where(Job.id == job_id, Job.org_id == org_id))
        if status is None:
            raise NotFound(f"no job {job_id!r} in your organisation")
        if _job_cancel_is_noop(job_id, JobStatus(status)):
            job = get_job_for_org(session, org_id, job_id)
            session.commit()
            return job
        lock_briefly(session)
        job = get_job_for_org(session, org_id, job_id, lock=True)
        status = JobStatus(job.status)
        if not _job_cancel_is_noop(job_id, status):  # another request may have cancelled it while we waited
            job.cancel_requested_at = utcnow()
            # Nothing runs a queued or waiting job, so it ends at once; a running one waits for the worker's
            # acknowledgement.
            idle = status in (JobStatus.QUEUED, JobStatus.WAITING)
            transition(session, job, JobStatus.CANCELLED if idle else JobStatus.CANCELLING,
                       reason="cancellation requested")
        session.commit()
        return job
    except BaseException:
        session.rollback()
        raise


def _job_cancel_is_noop(job_id: str, status: JobStatus) -> bool:
    """True when the job is already cancelling or cancelled (cancelling twice is not an error); refuses a finished
    job."""
    if status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise InvalidTransition(f"job {job_id} already {status}; there is nothing to cancel",
                                extra={"job_status": str(status)})
    return status in (JobStatus.CANCELLING, JobStatus.CANCELLED)


# A queued job nothing has happened to for this long (no worker picked it up, no event: `updated_at` moves with
# every change to the row) is presumed to have lost its broker message, and resume sends it again. Presumed, not
# known: the message may only be waiting behind busy workers. The copy is then harmless: the worker that takes
# the second message finds the stage claimed by a live heartbeat, or the job finished, and does nothing.
QUEUED_PRESUMED_LOST_SECONDS = 600


def resume_job(
    session: Session, settings: Settings, queue: RecordingQueue | CeleryQueue, org_id: str, job_id: str
) -> Job:
    job = get_job_for_org(session, org_id, job_id, lock=True)
    if job.status in (JobStatus.QUEUED, JobStatus.WAITING):
        return _requeue(session, queue, job)
    if job.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise InvalidTransition(
            f"job {job.id} is {job.status}; only failed or cancelled jobs (or a job queued or waiting with no sign "
            f"of a worker for {QUEUED_PRESUMED_LOST_SECONDS} s) can be resumed",
            extra={"job_status": job.status},
        )
    org, active = lock_org_and_count_active(session, org_id)
    refuse_if_full(org, active, settings)
    check_quota(session, org, settings, what="resume")
    resume_at = next_stage(session, job.id)
    previous_error = job.error_code
    job.error_code = job.error_message = job.error_stage = None
    job.resume_count += 1
    transition(session, job, JobStatus.QUEUED, reason="resumed")
    append_event(
        session, job, "job.resumed", f"resumed; continues at stage {resume_at}",
        stage=str(resume_at) if resume_at else None,
        data={"resume_stage": str(resume_at) if resume_at else None, "previous_error": previous_error},
    )
    session.commit()
    _enqueue_or_fail(session, queue, job, resume_at)
    return job


def _requeue(session: Session, queue: RecordingQueue | CeleryQueue, job: Job) -> Job:
    """Send a queued or waiting job's message again when it looks lost. The status stays (no transition: the job
    already holds its place in the organisation's limit and was admitted against its quota once)."""
    idle = (utcnow() - job.updated_at).total_seconds()
    if idle < QUEUED_PRESUMED_LOST_SECONDS:
        raise InvalidTransition(
            f"job {job.id} is {job.status} and was last touched {idle:.0f} s ago; it is waiting for a worker. If no "
            f"worker has started it after {QUEUED_PRESUMED_LOST_SECONDS} s its message is presumed lost and "
            "resume sends it again; until then, wait (or cancel it)",
            retry_after_seconds=int(QUEUED_PRESUMED_LOST_SECONDS - idle) + 1, extra={"job_status": job.status},
        )
    resume_at = next_stage(session, job.id)
    job.resume_count += 1
    append_event(
        session, job, "job.resumed", f"{job.status} for {idle:.0f} s with no worker: message sent again; continues at "
        f"stage {resume_at}", stage=str(resume_at) if resume_at else None,
        data={"resume_stage": str(resume_at) if resume_at else None, "requeued": True, "idle_seconds": round(idle)},
    )
    session.commit()
    _enqueue_or_fail(session, queue, job, resume_at)
    return job
