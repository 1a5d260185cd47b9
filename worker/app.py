"""The Celery app and its three tasks: `draftsmith.run_job(job_id)` and `draftsmith.run_audit(audit_id)` (the names
the API sends), and `draftsmith.generate_shards(job_id)` (sent by the worker leading a job's generate stage to its
helpers, worker/shards.py).

    celery -A worker.app worker -Q draftsmith.gpu,draftsmith.cpu      # what `draftsmith worker` runs

Settings for hour-long GPU work: a task is acknowledged only when it ends (acks_late) and put back if its
process dies (reject_on_worker_lost); each process takes one task at a time, and a busy worker reserves nothing
(disable_prefetch, below), so a job queued behind it goes to an idle worker; Redis redelivers
an unacknowledged task only after `broker_visibility_timeout_seconds`, longer than any stage. Liveness is
decided by the database heartbeat instead: every worker runs a reaper thread that re-queues jobs whose
worker went quiet (take_over_stale_jobs), so a killed machine's job resumes within minutes, not hours.
"""

from __future__ import annotations

import logging
import os
import threading

from celery import Celery, signals

from domain.queue import (
    GENERATE_SHARDS_TASK,
    RUN_AUDIT_TASK,
    RUN_JOB_TASK,
    audit_queue,
    celery_broker_options,
    queue_for,
)
from domain.redaction import install_log_redaction, register_secret_values, secret_setting_values
from domain.settings import load_settings
from schemas.stages import Stage
from worker.context import current_context
from worker.errors import infrastructure_errors
from worker.reporting import drain_marker
from worker.runner import run_job

log = logging.getLogger("draftsmith.worker")
RETRY_BACKOFF_SECONDS = (10, 30, 90, 270)
REDIS_SCHEMES = ("redis", "rediss", "redis+socket", "sentinel")
HANDOVER_RETRY = {"max_retries": 60, "interval_start": 1, "interval_step": 1, "interval_max": 5}

_settings = load_settings()
install_log_redaction()  # no credential, key or secret setting verbatim in any log line of a worker
register_secret_values(*secret_setting_values(_settings))
app = Celery("draftsmith-worker")
app.conf.update(celery_broker_options(_settings))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # Prefetch 1 with acks_late is not enough on Redis: after a broker reconnect the running task's message no
    # longer counts against the new channel's window, and a busy worker reserved the next job for the length of
    # its own (jobs waited 20 minutes while an idle worker ran a later one). With this, a worker fetches
    # only while it has fewer reserved tasks than processes (celery/worker/consumer/tasks.py). Redis only: Celery
    # ignores it, with a warning, on another transport (the embedded file broker has one worker).
    worker_disable_prefetch=_settings.broker_url.partition("://")[0] in REDIS_SCHEMES,
    task_ignore_result=True,  # the job row holds the truth, not a result backend
    broker_connection_retry_on_startup=True,  # a worker may start before its broker
    broker_connection_max_retries=None,
    worker_cancel_long_running_tasks_on_connection_loss=False,  # a broker restart must not kill training
    worker_hijack_root_logger=False,
)


def send_run_job(job_id: str, stage: Stage) -> None:
    app.send_task(RUN_JOB_TASK, args=[job_id], queue=queue_for(_settings, stage), retry=True,
                  retry_policy=HANDOVER_RETRY)


@app.task(name=RUN_JOB_TASK, bind=True, max_retries=None)
def run_job_task(self, job_id: str) -> str:
    ctx = current_context()
    retries_left = ctx.settings.worker_max_retries - self.request.retries
    try:
        return str(run_job(ctx, job_id, send_run_job, send_helpers=send_generate_helpers,
                           retries_left=retries_left))
    except infrastructure_errors() as error:
        if retries_left <= 0:
            raise  # the job is failed already, or the database is down and the reaper will re-queue it later
        countdown = RETRY_BACKOFF_SECONDS[min(self.request.retries, len(RETRY_BACKOFF_SECONDS) - 1)]
        log.warning("job %s: %s; retrying in %s s", job_id, error, countdown)
        raise self.retry(exc=error, countdown=countdown) from None


@app.task(name=GENERATE_SHARDS_TASK)
def generate_shards_task(job_id: str) -> str:
    """A helper of a job's generate stage (worker/shards.py). An error leaves its shard to go quiet and be taken
    over by the lead, which waits for every shard."""
    from worker.shards import help_generate

    return help_generate(current_context(), job_id)


def send_generate_helpers(job_id: str, count: int) -> None:
    for _ in range(count):
        app.send_task(GENERATE_SHARDS_TASK, args=[job_id], queue=queue_for(_settings, Stage.GENERATE), retry=True,
                      retry_policy=HANDOVER_RETRY)


@app.task(name=RUN_AUDIT_TASK)
def run_audit_task(audit_id: str) -> str:
    """A drift audit (worker/audits.py). An infrastructure error leaves it to the reaper to queue again."""
    from worker.audits import execute_audit

    return execute_audit(current_context(), audit_id)


def send_run_audit(audit_id: str) -> None:
    app.send_task(RUN_AUDIT_TASK, args=[audit_id], queue=audit_queue(_settings), retry=True,
                  retry_policy=HANDOVER_RETRY)


class Reaper(threading.Thread):
    """Re-queues jobs whose worker went quiet. One per worker process; the conditional claim in
    take_over_stale_jobs makes sure only one reaper acts on each stale job."""

    def __init__(self) -> None:
        super().__init__(name="draftsmith-reaper", daemon=True)
        self.stopped = threading.Event()

    def run(self) -> None:
        from domain import runs
        from domain.db import SessionTimeouts, create_db_engine, create_session_factory

        settings = _settings
        # No pooled connections in the pool's parent process: forked children must not inherit live sockets.
        factory = create_session_factory(create_db_engine(settings.database_url, null_pool=True,
                                                          timeouts=SessionTimeouts.for_worker(settings)))
        interval = max(1.0, settings.worker_stale_after_seconds / 4)
        while not self.stopped.wait(interval):
            try:
                with factory() as session:
                    for job_id, stage in runs.take_over_stale_jobs(session, settings.worker_stale_after_seconds):
                        runs.record_event(session, job_id, f"the worker running {stage} went quiet; the job "
                                            "waits for a free worker and resumes from its last checkpoint",
                                            level="warning")
                        send_run_job(job_id, stage)
                    from domain.audits import take_over_stale_audits

                    for audit_id in take_over_stale_audits(session, settings.worker_stale_after_seconds):
                        send_run_audit(audit_id)
            except Exception:  # keep reaping; the database or broker may be back next time
                log.warning("reaper pass failed", exc_info=True)


_reaper = Reaper()


@signals.worker_ready.connect
def _start_reaper(**_kwargs) -> None:
    drain_marker(current_context(), os.getpid()).unlink(missing_ok=True)  # a previous process's, same pid
    _reaper.start()


@signals.worker_shutting_down.connect
def _drain(**_kwargs) -> None:
    """Warm shutdown (SIGTERM, a scale-in, a deploy): running stages checkpoint and hand their jobs over."""
    marker = drain_marker(current_context(), os.getpid())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


@signals.worker_shutdown.connect
def _stop_reaper(**_kwargs) -> None:
    _reaper.stopped.set()
    drain_marker(current_context(), os.getpid()).unlink(missing_ok=True)
