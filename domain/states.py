"""Job states and the single place where a job changes state.

    queued → preparing → generating → training → validating → exporting → publishing → succeeded
    any non-terminal state → failed            (error code, message, failing stage)
    a running state → cancelling → cancelled   (the worker acknowledges at a safe point)
    queued → cancelled                          (nothing runs yet, so nothing to wait for)
    a running state → waiting                   (its worker went quiet: re-queued once, for the next free worker)
    waiting → any running state | failed | cancelled   (a worker resumes it; or, nothing running, cancel at once)
    failed | cancelled → queued                 (resume: restarts at the first unfinished stage)

`TRANSITIONS` is the whole table and `transition()` the only function that writes `Job.status`.
Routes (cancel, resume) and the stage-runner API (claim, finish, fail) all go through it, so an
illegal move such as `succeeded → training` is rejected the same way wherever it comes from.
Each transition also appends a `job.status_changed` event and queues the matching webhooks in the
same database transaction, so observers never see a state without its event.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from domain.errors import InvalidTransition
from domain.events import append_event
from domain.models import Job, utcnow
from domain.statuses import JobStatus as JobStatus  # the one list of job statuses (re-exported here)
from domain.webhooks import enqueue_job_webhooks
from schemas.stages import STAGE_ORDER as STAGE_ORDER  # the one list of stage names (re-exported here)
from schemas.stages import Stage as Stage

STATUS_OF_STAGE: dict[Stage, JobStatus] = {
    Stage.PREPARE: JobStatus.PREPARING,
    Stage.GENERATE: JobStatus.GENERATING,
    Stage.TRAIN: JobStatus.TRAINING,
    Stage.VALIDATE: JobStatus.VALIDATING,
    Stage.EXPORT: JobStatus.EXPORTING,
    Stage.PUBLISH: JobStatus.PUBLISHING,
}
STAGE_OF_STATUS: dict[JobStatus, Stage] = {status: stage for stage, status in STATUS_OF_STAGE.items()}
RUNNING_STATUSES: frozenset[JobStatus] = frozenset(STATUS_OF_STAGE.values())
TERMINAL_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# Everything not terminal holds one of the organisation's concurrency slots.
ACTIVE_STATUSES: frozenset[JobStatus] = frozenset(JobStatus) - TERMINAL_STATUSES


def _running_successor(status: JobStatus) -> set[JobStatus]:
    stage = STAGE_OF_STATUS[status]
    index = STAGE_ORDER.index(stage)
    if index + 1 < len(STAGE_ORDER):
        return {STATUS_OF_STAGE[STAGE_ORDER[index + 1]]}
    return {JobStatus.SUCCEEDED}


TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # From queued a (resumed) job may start at any stage: the stage runner checks it is the right one.
    JobStatus.QUEUED: frozenset(RUNNING_STATUSES | {JobStatus.CANCELLED, JobStatus.FAILED}),
    **{
        status: frozenset(_running_successor(status) | {JobStatus.FAILED, JobStatus.CANCELLING, JobStatus.WAITING})
        for status in RUNNING_STATUSES
    },
    # Whatever the worker reports while cancellation is pending (stage done, stage failed), the job
    # ends cancelled: that is what the user asked for, and the stage's own outcome stays on its run.
    # A waiting job resumes at the stage its worker left (the stage runner checks it is the right one).
    JobStatus.WAITING: frozenset(RUNNING_STATUSES | {JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED}),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED}),
    JobStatus.CANCELLED: frozenset({JobStatus.QUEUED}),
    JobStatus.SUCCEEDED: frozenset(),
}

# Which webhook event a transition emits (besides job.stage_changed on entering any stage).
_TERMINAL_WEBHOOK = {
    JobStatus.SUCCEEDED: "job.succeeded",
    JobStatus.FAILED: "job.failed",
    JobStatus.CANCELLED: "job.cancelled",
}


def transition(session: Session, job: Job, target: JobStatus, *, reason: str | None = None) -> None:
    """Move `job` to `target` if the table allows it; raise InvalidTransition otherwise.

    Writes in the caller's transaction (the caller commits): status and timestamps, one
    `job.status_changed` event, and the webhook deliveries for the change.
    """
    current = JobStatus(job.status)
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (terminal)"
        raise InvalidTransition(
            f"job {job.id} is {current}; it cannot become {target} (allowed from {current}: {allowed})",
            extra={"job_status": str(current)},
        )
    now = utcnow()
    previous_stage = job.stage
    job.status = str(target)
    job.updated_at = now
    if target in RUNNING_STATUSES:
        job.stage = str(STAGE_OF_STATUS[target])
        if job.started_at is None:
            job.started_at = now
    if target in TERMINAL_STATUSES:
        job.finished_at = now
    if target is JobStatus.QUEUED:  # resumed: a fresh run, with no pending cancellation
        job.finished_at = None
        job.cancel_requested_at = None
    append_event(
        session,
        job,
        "job.status_changed",
        reason or f"{current} → {target}",
        stage=job.stage,
        level="error" if target is JobStatus.FAILED else "info",
        data={"from": str(current), "to": str(target)},
    )
    if current is JobStatus.QUEUED and target in RUNNING_STATUSES:
        enqueue_job_webhooks(session, job, "job.started")
    # A waiting job resumed at the stage it was in has not changed stage: subscribers heard of that stage already.
    if target in RUNNING_STATUSES and not (current is JobStatus.WAITING and job.stage == previous_stage):
        enqueue_job_webhooks(session, job, "job.stage_changed", extra={"previous_status": str(current)})
    if target in _TERMINAL_WEBHOOK:
        enqueue_job_webhooks(session, job, _TERMINAL_WEBHOOK[target])
