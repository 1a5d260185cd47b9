"""`run_job(ctx, job_id)`: everything the Celery task does, as a plain function of a job id.

    while the job has a next stage:
        next stage on another queue (gpu -> cpu)?  hand the job to that queue and return
        claim it (refused if a live worker holds it, or the job was cancelled meanwhile)
        run it with a heartbeat (worker/stages.py), then finish it (the last one makes the job succeeded)

How a stage ends decides what happens to the job, and the job row records it:
    DraftsmithError (bad target, lossless check failed...)  -> failed, with the error's code; resumable
    StageInterrupted after a cancellation                    -> cancelled (training checkpointed first)
    a named infrastructure error (database, broker, storage unreachable)
                                                             -> the attempt is released and the task retried,
                                                                up to worker_max_retries, then failed
    anything else (a bug, out of memory)                     -> failed as internal_error / out_of_memory
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

from domain import runs
from domain.errors import InvalidTransition
from domain.jobs import job_by_id
from domain.models import Job
from domain.queue import queue_for
from domain.states import TERMINAL_STATUSES, JobStatus
from schemas.stages import Stage
from trainer.errors import DraftsmithError, StageInterrupted
from worker.context import WorkerContext
from worker.errors import infrastructure_errors, storage_refusal
from worker.reporting import DRAINING, StageReporter
from worker.shards import SendHelpers
from worker.stages import execute_stage

log = logging.getLogger("draftsmith.worker")


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    HANDED_OVER = "handed_over"
    CANCELLED = "cancelled"
    FAILED = "failed"
    BUSY = "busy"
    """Another live worker holds the job (a duplicate delivery): nothing done."""
    NOTHING_TO_DO = "nothing_to_do"


Send = Callable[[str, Stage], None]
"""Enqueue run_job(job_id) on the queue of the given stage."""


def run_job(ctx: WorkerContext, job_id: str, send: Send, *, send_helpers: SendHelpers | None = None,
            retries_left: int = 0) -> Outcome:
    """Run the job's stages that this worker's queues take, from the next one on; `send` hands the job to another
    queue, `send_helpers` asks other workers to help a generate stage (DRAFTSMITH_WORKER_GENERATE_WORKERS > 1)."""
    with ctx.session_factory() as session:
        job = job_by_id(session, job_id)
        if job is None or JobStatus(job.status) in TERMINAL_STATUSES:
            log.info("job %s: nothing to do (%s)", job_id, job.status if job else "no such job")
            return Outcome.NOTHING_TO_DO
        if runs.cancellation_requested(session, job_id):
            runs.acknowledge_cancellation(session, job_id)
            return Outcome.CANCELLED
        runs.begin_run(session, job_id)
    while True:
        with ctx.session_factory() as session:
            if runs.cancellation_requested(session, job_id):
                runs.acknowledge_cancellation(session, job_id)
                return Outcome.CANCELLED
            stage = runs.next_stage(session, job_id)
            if stage is None:
                return Outcome.SUCCEEDED
            queue = queue_for(ctx.settings, stage)
            if queue not in ctx.queues:
                send(job_id, stage)
                runs.record_event(session, job_id, f"handed to queue {queue} for stage {stage}", stage=stage)
                return Outcome.HANDED_OVER
            try:
                runs.claim_stage(session, job_id, stage, worker_id=ctx.worker_id,
                                   stale_after_seconds=ctx.settings.worker_stale_after_seconds)
            except runs.StageBusy:
                return Outcome.BUSY
            except runs.CancellationPending:
                runs.acknowledge_cancellation(session, job_id)
                return Outcome.CANCELLED
            except (InvalidTransition, runs.StageConflict) as exc:  # cancelled while queued, or raced
                log.info("job %s: not running %s: %s", job_id, stage, exc)
                return Outcome.NOTHING_TO_DO
            job = job_by_id(session, job_id)
        outcome = _run_claimed(ctx, job, stage, send, send_helpers, retries_left)
        if outcome is not None:
            return outcome


def _run_claimed(ctx: WorkerContext, job: Job, stage: Stage, send: Send, send_helpers: SendHelpers | None,
                 retries_left: int) -> Outcome | None:
    """Run a claimed stage to its end; None means it finished and the job goes on to its next stage."""
    reporter = StageReporter(ctx, job.id, stage)
    try:
        with reporter:
            execute_stage(ctx, job, stage, reporter, send_helpers)
    except StageInterrupted:
        with ctx.session_factory() as session:
            if runs.cancellation_requested(session, job.id):
                runs.acknowledge_cancellation(session, job.id)
                return Outcome.CANCELLED
            if reporter.stop_reason == DRAINING:  # checkpointed: another worker continues from it now
                runs.release_stage(session, job.id, stage, ctx.worker_id, "its worker is shutting down")
                send(job.id, stage)
                return Outcome.HANDED_OVER
        return Outcome.BUSY  # the attempt was taken over by another worker after this one stalled
    except DraftsmithError as error:
        return _fail(ctx, job.id, stage, error.code, str(error))
    except infrastructure_errors() as error:
        reason = f"{type(error).__name__}: {error}"[:2000]
        if retries_left <= 0:
            return _fail(ctx, job.id, stage, "infrastructure_error",
                         f"gave up after repeated infrastructure errors; last: {reason}")
        try:
            with ctx.session_factory() as session:
                runs.release_stage(session, job.id, stage, ctx.worker_id, f"will retry after {reason}")
        except infrastructure_errors():
            log.warning("job %s: could not release %s before retrying", job.id, stage, exc_info=True)
        raise
    except MemoryError:
        return _fail(ctx, job.id, stage, "out_of_memory", f"stage {stage} ran out of memory; use a machine with "
                     "more memory or lower batch_size")
    except Exception as error:  # a bug: fail the job visibly, keep its data, let the user resume
        if (refusal := storage_refusal(error)) is not None:
            return _fail(ctx, job.id, stage, "storage_error", refusal)
        log.exception("job %s: stage %s crashed", job.id, stage)
        code = "out_of_memory" if "out of memory" in str(error).lower() else "internal_error"
        return _fail(ctx, job.id, stage, code, f"{type(error).__name__}: {error}"[:2000])
    with ctx.session_factory() as session:
        try:
            status = runs.finish_stage(session, job.id, stage)
        except runs.StageConflict:
            return Outcome.BUSY  # finished here, but the attempt had been taken over meanwhile
    if status is JobStatus.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.SUCCEEDED if status is JobStatus.SUCCEEDED else None


def _fail(ctx: WorkerContext, job_id: str, stage: Stage, code: str, message: str) -> Outcome:
    with ctx.session_factory() as session:
        status = runs.fail_job(session, job_id, code=code, message=message, stage=stage)
    return Outcome.CANCELLED if status is JobStatus.CANCELLED else Outcome.FAILED
