"""The stage-runner API: the only functions the worker uses to report on a job.

Each function takes a SQLAlchemy `Session` and a job id, does its work in one transaction and
**commits** before returning. State changes go through `domain.states.transition`, the same guard the
HTTP routes use. Build a session the way the API does:

    from domain.db import create_db_engine, create_session_factory
    factory = create_session_factory(create_db_engine(settings.database_url))

A Celery task `draftsmith.run_job(job_id)` is expected to loop:

    while (stage := next_stage(session, job_id)) is not None:
        claim_stage(session, job_id, stage, worker_id=...)          # queued/previous → stage state
        ...work, calling record_event(..., progress=42.0), record_metrics(...),
           store_artifact(...) / register_artifact(...) as it goes...
        if cancellation_requested(session, job_id):
            acknowledge_cancellation(session, job_id); return       # → cancelled
        finish_stage(session, job_id, stage)                        # last stage → succeeded
    (on an error: fail_job(session, job_id, code="oom", message=..., stage=stage); → failed)

Functions:
  next_stage(session, job_id) -> Stage | None      first stage without a succeeded attempt
  claim_stage(session, job_id, stage, worker_id)   new attempt row; moves the job into the stage's
                                                   state. Re-claiming the current stage (a redelivered
                                                   task) marks the older running attempt `abandoned`.
                                                   Raises CancellationPending if a cancel is pending,
                                                   InvalidTransition if the job cannot run (e.g. was
                                                   cancelled while queued), StageConflict if `stage`
                                                   is not the next one.
  record_event(session, job_id, message, stage=, progress=, level=, data=) -> seq
  record_metrics(session, job_id, step, {"loss": 2.1, ...}, stage=) -> points written
  register_artifact(session, job_id, name, storage_key=, size_bytes=, sha256=, kind=, ...) -> Artifact
  store_artifact(session, storage, job_id, name, path, kind=, ...) -> Artifact   upload, then register
  finish_stage(session, job_id, stage) -> JobStatus
  fail_job(session, job_id, code=, message=, stage=)
  cancellation_requested(session, job_id) -> bool
  acknowledge_cancellation(session, job_id)

An artifact is registered only after its bytes are fully stored, so a listed artifact is whole.

Liveness (for workers that die without a word): `begin_run` counts each pickup on the job,
`heartbeat` refreshes the running attempt, `claim_stage(..., stale_after_seconds=)` refuses a stage a
live worker holds (StageBusy), and `take_over_stale_jobs` finds jobs whose worker went quiet, so that
another worker can continue them from their last checkpoint.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from domain.artifacts import artifact_named
from domain.db import execute_dml
from domain.errors import CancellationPending, InvalidTransition, NotFound, StageBusy, StageConflict
from domain.events import append_event
from domain.jobs import load_stored_spec, next_stage
from domain.models import Artifact, Job, MetricPoint, Publication, StageRun, utcnow
from domain.states import RUNNING_STATUSES, STAGE_ORDER, STATUS_OF_STAGE, JobStatus, Stage, transition
from domain.statuses import StageRunStatus, job_status_text
from domain.storage import LocalStorage, S3Storage, check_key

__all__ = [
    "CancellationPending", "StageBusy", "StageConflict", "acknowledge_cancellation", "artifact_storage_key",
    "begin_run", "cancellation_requested", "claim_stage", "discard_metrics", "fail_job", "finish_stage", "heartbeat", "next_stage",
    "record_drafter", "record_event", "record_metrics", "record_publication", "record_usage", "register_artifact",
    "release_stage", "store_artifact", "take_over_stale_jobs",
]

_CODE_RE = re.compile(r"^[a-z0-9_.-]{1,64}$")
_METRIC_RE = re.compile(r"^[A-Za-z0-9_./-]{1,100}$")
_KIND_RE = re.compile(r"^[a-z0-9_-]{1,32}$")


def _locked_job(session: Session, job_id: str) -> Job:
    # populate_existing: a long-lived worker session must not act on a stale copy of the row.
    job = session.scalar(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    )
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def _running_attempt(session: Session, job_id: str, stage: str | None) -> StageRun | None:
    if stage is None:
        return None
    return session.scalar(
        select(StageRun)
        .where(StageRun.job_id == job_id, StageRun.stage == stage, StageRun.status == str(StageRunStatus.RUNNING))
        .order_by(StageRun.attempt.desc())
        .limit(1)
    )


def claim_stage(session: Session, job_id: str, stage: Stage | str, *, worker_id: str | None = None,
                stale_after_seconds: float | None = None) -> StageRun:
    stage = Stage(stage)
    job = _locked_job(session, job_id)
    if job.status == JobStatus.CANCELLING:
        raise CancellationPending(f"job {job_id} has a pending cancellation; acknowledge it instead of starting {stage}")
    expected = next_stage(session, job_id)
    if stage != expected:
        raise StageConflict(f"job {job_id} cannot start {stage}: the next stage is {expected or 'none (all done)'}")
    target = STATUS_OF_STAGE[stage]
    now = utcnow()
    if stale_after_seconds is not None and (holder := _live_attempt(session, job_id, stage, stale_after_seconds)):
        session.rollback()
        raise StageBusy(f"job {job_id}: {holder.worker_id} is running {stage} (heartbeat {holder.heartbeat_at})")
    if job.status == target:
        # The same stage claimed again (worker died, task redelivered): the old attempt is over.
        for stale in session.scalars(select(StageRun).where(
            StageRun.job_id == job_id, StageRun.stage == stage, StageRun.status == str(StageRunStatus.RUNNING))):
            stale.status, stale.finished_at = str(StageRunStatus.ABANDONED), now
            stale.error_message = "superseded by a new attempt"
    else:
        transition(session, job, target, reason=f"stage {stage} started")
    attempt = (session.scalar(
        select(func.max(StageRun.attempt)).where(StageRun.job_id == job_id, StageRun.stage == stage)
    ) or 0) + 1
    run = StageRun(job_id=job_id, stage=str(stage), attempt=attempt, status=str(StageRunStatus.RUNNING),
                   worker_id=worker_id, progress=0.0, started_at=now, heartbeat_at=now)
    session.add(run)
    append_event(session, job, "stage.started", f"stage {stage} started (attempt {attempt})", stage=str(stage),
                 progress=0.0, data={"attempt": attempt, "worker_id": worker_id})
    session.commit()
    return run


def record_event(
    session: Session,
    job_id: str,
    message: str,
    *,
    stage: Stage | str | None = None,
    progress: float | None = None,
    level: str = "info",
    data: dict[str, Any] | None = None,
) -> int:
    """Log a message (and, with `progress`, the running stage's percent complete). Returns its seq."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    stage_name = str(Stage(stage)) if stage is not None else job.stage
    event = append_event(
        session, job, "stage.progress" if progress is not None else "log", message,
        stage=stage_name, level=level, progress=progress, data=data,
    )
    if progress is not None and (run := _running_attempt(session, job_id, stage_name)) is not None:
        run.progress = progress
    session.commit()
    return event.seq


def record_metrics(
    session: Session, job_id: str, step: int, values: Mapping[str, float], *, stage: Stage | str | None = None
) -> int:
    """Store one point per metric at `step`. Non-finite values (a NaN loss) are kept as nulls."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    stage_name = str(Stage(stage)) if stage is not None else job.stage
    now = utcnow()
    points = []
    for name, value in values.items():
        if not _METRIC_RE.match(name):
            raise ValueError(f"metric name {name!r} must be 1-100 characters of letters, digits, '_', '.', '/', '-'")
        number = float(value)
        points.append(MetricPoint(job_id=job_id, stage=stage_name, name=name, step=step,
                                  value=number if math.isfinite(number) else None, created_at=now))
    session.add_all(points)
    session.commit()
    return len(points)


def discard_metrics(session: Session, job_id: str, stage: Stage | str, from_step: int) -> int:
    """Drop a stage's points at `from_step` and later: a resumed stage replays those steps from its checkpoint,
    and a series must not hold two values for one step. Returns the points removed."""
    removed = execute_dml(session,
        delete(MetricPoint).where(MetricPoint.job_id == job_id, MetricPoint.stage == str(Stage(stage)),
                                  MetricPoint.step >= from_step).execution_options(synchronize_session=False)
    ).rowcount
    session.commit()
    return removed


def artifact_storage_key(job_id: str, name: str) -> str:
    return check_key(f"jobs/{job_id}/artifacts/{name}")


def register_artifact(
    session: Session,
    job_id: str,
    name: str,
    *,
    storage_key: str,
    size_bytes: int,
    sha256: str,
    kind: str,
    content_type: str = "application/octet-stream",
    stage: Stage | str | None = None,
) -> Artifact:
    """Record an artifact already written to storage. Registering a name again replaces it (a rerun)."""
    check_key(name)
    check_key(storage_key)
    if not _KIND_RE.match(kind):
        raise ValueError(f"artifact kind {kind!r} must be 1-32 characters of a-z, 0-9, '_', '-'")
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError("sha256 must be 64 lowercase hex characters")
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    stage_name = str(Stage(stage)) if stage is not None else job.stage
    artifact = artifact_named(session, job_id, name)
    if artifact is None:
        artifact = Artifact(job_id=job_id, name=name)
        session.add(artifact)
    artifact.kind, artifact.stage, artifact.storage_key = kind, stage_name, storage_key
    artifact.size_bytes, artifact.sha256, artifact.content_type = size_bytes, sha256, content_type
    artifact.created_at = utcnow()
    session.flush()
    append_event(session, job, "artifact.created", f"artifact {name} ({size_bytes} bytes)", stage=stage_name,
                 data={"name": name, "kind": kind, "sha256": sha256, "size_bytes": size_bytes})
    session.commit()
    return artifact


def store_artifact(
    session: Session,
    storage: LocalStorage | S3Storage,
    job_id: str,
    name: str,
    path: str | Path,
    *,
    kind: str,
    content_type: str = "application/octet-stream",
    stage: Stage | str | None = None,
) -> Artifact:
    """Upload a local file to the job's artifact area, then register it."""
    key = artifact_storage_key(job_id, name)
    stored = storage.put_file(key, path)
    return register_artifact(session, job_id, name, storage_key=key, size_bytes=stored.size_bytes,
                             sha256=stored.sha256, kind=kind, content_type=content_type, stage=stage)


def read_artifact(session: Session, storage: LocalStorage | S3Storage, job_id: str, name: str) -> bytes | None:
    """A registered artifact's content, for the small records a later stage reads back (drafter-record.json,
    manifest.json); None when the job has no artifact of that name."""
    row = artifact_named(session, job_id, name)
    return None if row is None else b"".join(storage.open_chunks(row.storage_key))


def finish_stage(session: Session, job_id: str, stage: Stage | str) -> JobStatus:
    """Mark the running attempt succeeded; the last stage makes the job succeeded."""
    stage = Stage(stage)
    job = _locked_job(session, job_id)
    run = _running_attempt(session, job_id, str(stage))
    if run is None:
        raise StageConflict(f"job {job_id} has no running attempt of stage {stage} to finish")
    run.status, run.finished_at, run.progress = str(StageRunStatus.SUCCEEDED), utcnow(), 100.0
    job.updated_at = run.finished_at  # a hand-over to the next stage starts its clock now (take_over_stale_jobs)
    append_event(session, job, "stage.finished", f"stage {stage} finished", stage=str(stage), progress=100.0)
    if job.status == JobStatus.CANCELLING:
        transition(session, job, JobStatus.CANCELLED, reason=f"cancelled after stage {stage} finished")
    elif stage == STAGE_ORDER[-1]:
        transition(session, job, JobStatus.SUCCEEDED, reason="all stages finished")
    session.commit()
    return JobStatus(job.status)


def fail_job(session: Session, job_id: str, *, code: str, message: str, stage: Stage | str | None = None) -> JobStatus:
    """End the job as failed (or cancelled, if a cancellation was pending) with a code and message."""
    if not _CODE_RE.match(code):
        raise ValueError(f"error code {code!r} must be 1-64 characters of a-z, 0-9, '_', '.', '-'")
    job = _locked_job(session, job_id)
    stage_name = str(Stage(stage)) if stage is not None else job.stage
    run = _running_attempt(session, job_id, stage_name)
    if run is not None:
        run.status, run.finished_at = str(StageRunStatus.FAILED), utcnow()
        run.error_code, run.error_message = code, message[:10_000]
    append_event(session, job, "stage.failed", f"{code}: {message}"[:10_000], stage=stage_name, level="error",
                 data={"code": code})
    if job.status == JobStatus.CANCELLING:
        transition(session, job, JobStatus.CANCELLED, reason=f"cancelled (stage {stage_name} stopped with {code})")
    else:
        job.error_code, job.error_message, job.error_stage = code, message[:10_000], stage_name
        transition(session, job, JobStatus.FAILED, reason=f"failed in stage {stage_name}: {code}")
    session.commit()
    return JobStatus(job.status)


def cancellation_requested(session: Session, job_id: str) -> bool:
    """Poll at safe points (between steps/batches); True means stop and acknowledge."""
    status = session.scalar(select(Job.status).where(Job.id == job_id).execution_options(populate_existing=True))
    if status is None:
        raise NotFound(f"no job {job_id!r}")
    session.rollback()  # end the read transaction so the next poll sees fresh data
    return status in (JobStatus.CANCELLING, JobStatus.CANCELLED)


def acknowledge_cancellation(session: Session, job_id: str) -> None:
    job = _locked_job(session, job_id)
    if job.status == JobStatus.CANCELLED:
        session.commit()
        return
    if job.status != JobStatus.CANCELLING:
        raise InvalidTransition(f"job {job_id} is {job.status}; no cancellation to acknowledge")
    run = _running_attempt(session, job_id, job.stage)
    if run is not None:
        run.status, run.finished_at = str(StageRunStatus.CANCELLED), utcnow()
    transition(session, job, JobStatus.CANCELLED, reason="cancelled by request")
    session.commit()


def _live_attempt(session: Session, job_id: str, stage: Stage, stale_after_seconds: float) -> StageRun | None:
    cutoff = utcnow() - timedelta(seconds=stale_after_seconds)
    return session.scalar(select(StageRun).where(
        StageRun.job_id == job_id, StageRun.stage == str(stage), StageRun.status == str(StageRunStatus.RUNNING),
        StageRun.heartbeat_at >= cutoff).limit(1))


def begin_run(session: Session, job_id: str) -> int:
    """A worker picked the job up: count it (the job's `run_attempts`) and return the new count."""
    job = _locked_job(session, job_id)
    job.run_attempts += 1
    session.commit()
    return job.run_attempts


def heartbeat(session: Session, job_id: str, stage: Stage | str, worker_id: str) -> bool:
    """Refresh this worker's running attempt of `stage`. False: the attempt is no longer this worker's to run
    (taken over after a stall, or ended by a cancellation): stop working on it."""
    result = execute_dml(session,
        update(StageRun)
        .where(StageRun.job_id == job_id, StageRun.stage == str(Stage(stage)),
               StageRun.status == str(StageRunStatus.RUNNING), StageRun.worker_id == worker_id)
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return result.rowcount > 0


def release_stage(session: Session, job_id: str, stage: Stage | str, worker_id: str, reason: str) -> None:
    """This worker gives its running attempt up (to retry after an infrastructure error): mark it abandoned so
    the retry, on any worker, may claim the stage at once."""
    job = _locked_job(session, job_id)
    run = session.scalar(select(StageRun).where(
        StageRun.job_id == job_id, StageRun.stage == str(Stage(stage)), StageRun.status == str(StageRunStatus.RUNNING),
        StageRun.worker_id == worker_id))
    if run is not None:
        run.status, run.finished_at, run.error_message = str(StageRunStatus.ABANDONED), utcnow(), reason[:10_000]
        append_event(session, job, "stage.released", f"stage {stage} attempt {run.attempt} released: {reason}"[:10_000],
                     stage=str(Stage(stage)), level="warning")
    session.commit()


def take_over_stale_jobs(session: Session, stale_after_seconds: float) -> list[tuple[str, Stage]]:
    """Jobs whose worker went quiet: a running attempt without a heartbeat for `stale_after_seconds`, or a
    running job with no attempt and no change for that long (a hand-over between queues was lost).

    Each is claimed with a conditional update (the quiet attempt becomes `abandoned`, or the idle job's
    updated_at moves to now), so of several workers looking at once exactly one gets it, and the stage is
    free to claim again. A running job becomes `waiting` (for a worker): it is re-queued once, and neither pass
    looks at it again while it waits, however long the workers stay busy (its message is in the queue; a lost one
    is sent again by resume). Returns (job_id, stage to run) to re-enqueue."""
    cutoff = utcnow() - timedelta(seconds=stale_after_seconds)
    taken: list[tuple[str, Stage]] = []
    stale_runs = session.execute(
        select(StageRun.id, StageRun.job_id, StageRun.stage).join(Job, Job.id == StageRun.job_id).where(
            StageRun.status == str(StageRunStatus.RUNNING),
            Job.status.in_([str(s) for s in RUNNING_STATUSES | {JobStatus.CANCELLING}]),
            or_(StageRun.heartbeat_at < cutoff, StageRun.heartbeat_at.is_(None)))
    ).all()
    for run_id, job_id, stage in stale_runs:
        claimed = execute_dml(session,
            update(StageRun).where(StageRun.id == run_id, StageRun.status == str(StageRunStatus.RUNNING),
                                   or_(StageRun.heartbeat_at < cutoff, StageRun.heartbeat_at.is_(None)))
            .values(status=str(StageRunStatus.ABANDONED), finished_at=utcnow(),
                    error_message=f"its worker went quiet (no heartbeat for {stale_after_seconds:g} s)")
            .execution_options(synchronize_session=False)
        ).rowcount
        if claimed:  # the job's clock restarts too, so the idle-job pass below leaves it to this hand-over
            _wait_for_worker(session, job_id, f"its worker went quiet in stage {stage}")
            taken.append((job_id, Stage(stage)))
        session.commit()
    running = session.scalars(select(StageRun.job_id).where(StageRun.status == str(StageRunStatus.RUNNING)))
    idle_jobs = session.execute(
        select(Job.id, Job.stage).where(Job.status.in_([str(s) for s in RUNNING_STATUSES]), Job.updated_at < cutoff,
                                        Job.id.not_in(running))
    ).all()
    for job_id, _stage in idle_jobs:
        claimed = execute_dml(session,
            update(Job).where(Job.id == job_id, Job.updated_at < cutoff)
            .values(updated_at=utcnow(), version=Job.version + 1).execution_options(synchronize_session=False)
        ).rowcount
        if claimed and (resume := next_stage(session, job_id)) is not None:
            _wait_for_worker(session, job_id, f"no worker took it up for {stale_after_seconds:g} s")
            taken.append((job_id, resume))
        session.commit()
    return taken


def _wait_for_worker(session: Session, job_id: str, why: str) -> None:
    """The reaper's claimed job: a running one becomes `waiting`; a cancelling one stays so (the next worker
    acknowledges the cancel), with its clock restarted. In the caller's transaction."""
    job = _locked_job(session, job_id)
    if job.status in RUNNING_STATUSES:
        transition(session, job, JobStatus.WAITING, reason=f"{why}; {job_status_text(JobStatus.WAITING)}")
    else:
        job.updated_at = utcnow()


def record_publication(session: Session, job_id: str, *, kind: str, location: str, revision: str | None,
                       url: str | None) -> Publication:
    """Record where the artifacts were published (publishing again to the same place replaces the record)."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    row = session.scalar(select(Publication).where(Publication.job_id == job_id, Publication.kind == kind,
                                                   Publication.location == location))
    if row is None:
        row = Publication(job_id=job_id, kind=kind, location=location)
        session.add(row)
    row.revision, row.url, row.created_at = revision, url, utcnow()
    session.flush()
    append_event(session, job, "publish.completed", f"published to {location}" + (f" at {revision}" if revision else ""),
                 stage=str(Stage.PUBLISH), data={"kind": kind, "location": location, "revision": revision, "url": url})
    session.commit()
    return row


def record_usage(session: Session, job_id: str, stage: Stage | str, *, compute_seconds: float = 0.0,
                 tokens_generated: int = 0, tokens_trained: int = 0) -> None:
    """What one attempt of `stage` spent, counted towards the organisation's monthly usage (domain/usage.py)."""
    from domain.usage import append_usage

    org_id = session.scalar(select(Job.org_id).where(Job.id == job_id))
    if org_id is None:
        raise NotFound(f"no job {job_id!r}")
    append_usage(session, org_id, job_id=job_id, stage=str(Stage(stage)), compute_seconds=compute_seconds,
                 tokens_generated=tokens_generated, tokens_trained=tokens_trained)
    session.commit()


def record_drafter(session: Session, job_id: str, **lineage: Any) -> str:
    """The job's published drafter and its lineage (domain/drafters.py `upsert_drafter`); returns its id."""
    from domain.drafters import upsert_drafter

    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    row = upsert_drafter(session, job, load_stored_spec(job.spec), **lineage)
    append_event(session, job, "log", f"drafter {row.id} published" + (f" (parent {row.parent_ref})" if row.parent_ref
                 else ""), stage=str(Stage.PUBLISH), data={"drafter_id": row.id, "parent_id": row.parent_id})
    session.commit()
    return row.id
