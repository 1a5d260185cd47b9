"""The worker's one door to a job's records (domain/runs.py): events, the cancellation poll, artifacts,
publications, the drafter and usage (JobRecords), and a running stage's line to the database on top of it:
progress, training metrics and a heartbeat (StageReporter). Only this module, worker/runner.py and the reaper
in worker/app.py import domain/runs.py (tests/test_layout.py).

The trainer reports progress as a fraction of the stage; this is the one place it becomes the API's
percent. Progress events and metric points are batched (at most one write a second), because a fast GPU
step must not wait on a database round trip. The heartbeat runs on its own thread with its own session:
it keeps the attempt visibly alive while the stage computes, and it is where a cancellation (or a takeover
by another worker, if this one stalled) is noticed, which `should_stop` then tells the trainer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from domain import runs
from domain.db import Session
from schemas.stages import Stage
from schemas.work_files import StepRecord
from trainer.pipeline import step_metrics
from worker.context import WorkerContext

log = logging.getLogger("draftsmith.worker")
FLUSH_SECONDS = 1.0
DRAINING = "this worker is shutting down"


def draining(ctx: WorkerContext) -> bool:
    """This process's worker is shutting down (its main process wrote the drain marker)."""
    return drain_marker(ctx, os.getppid()).exists()


def drain_marker(ctx: WorkerContext, worker_pid: int) -> Path:
    """A file the worker's main process writes on a warm shutdown (SIGTERM): its pool processes see it at their
    next heartbeat and hand their job over with a checkpoint, instead of running on until the grace period ends."""
    return ctx.cache / f"draining-{worker_pid}"


class JobRecords:
    """One job's records, written through the stage runs (domain/runs.py) in `session`: what the worker's
    stages, shard claims, publisher and usage count may write about a job, and nothing else."""

    def __init__(self, ctx: WorkerContext, job_id: str, stage: Stage, session: Session):
        self.ctx, self.job_id, self.stage, self.session = ctx, job_id, stage, session

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        runs.record_event(self.session, self.job_id, message, stage=self.stage, level=level, data=data)

    def cancellation_requested(self, session: Session) -> bool:
        """Asked on the heartbeat thread, in its own session."""
        return runs.cancellation_requested(session, self.job_id)

    def store_artifact(self, name: str, path: Path, *, kind: str, content_type: str) -> None:
        runs.store_artifact(self.session, self.ctx.storage, self.job_id, name, path, kind=kind,
                              content_type=content_type, stage=self.stage)

    def read_artifact(self, name: str) -> bytes | None:
        return runs.read_artifact(self.session, self.ctx.storage, self.job_id, name)

    def record_publication(self, *, kind: str, location: str, revision: str | None, url: str | None) -> None:
        runs.record_publication(self.session, self.job_id, kind=kind, location=location, revision=revision,
                                  url=url)

    def record_drafter(self, **lineage) -> str:
        return runs.record_drafter(self.session, self.job_id, **lineage)


def record_usage_in_own_session(ctx: WorkerContext, job_id: str, stage: Stage, *, compute_seconds: float,
                                tokens_generated: int, tokens_trained: int) -> None:
    """A stage attempt's usage (worker/usage.py) through domain/runs.py `record_usage`, in a session of its own:
    it is written however the attempt ended, whatever state the attempt's session is in."""
    with ctx.session_factory() as session:
        runs.record_usage(session, job_id, stage, compute_seconds=compute_seconds,
                            tokens_generated=tokens_generated, tokens_trained=tokens_trained)


class HeartbeatedWork:
    """Work that keeps a row visibly alive: `beat(session)` runs on its own thread (a HeartbeatThread) from enter to
    exit; exit then runs `finish()` and closes `session`, this object's own database session. A stage attempt
    (StageReporter) and a generate stage's shard claims (worker/shards.py ShardClaims) are both this."""

    def __init__(self, ctx: WorkerContext, name: str):
        self.session = ctx.session_factory()
        self._heartbeat = HeartbeatThread(ctx, name, self.beat)

    def __enter__(self):
        self._heartbeat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._heartbeat.stop()
        try:
            self.finish()
        finally:
            self.session.close()

    def beat(self, session: Session) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """What to settle, in `session`, once the heartbeat has stopped."""


class StageReporter(HeartbeatedWork, JobRecords):
    def __init__(self, ctx: WorkerContext, job_id: str, stage: Stage):
        HeartbeatedWork.__init__(self, ctx, f"heartbeat-{job_id}")
        JobRecords.__init__(self, ctx, job_id, stage, self.session)
        self.stop_reason: str | None = None
        self._pending_metrics: list[tuple[int, dict[str, float]]] = []
        self._replaced_older = False
        self._last_flush = 0.0
        self._last_percent = -1.0
        self._last_progress_at = 0.0

    def finish(self) -> None:
        self.flush()

    # --- hooks handed to the trainer (trainer.pipeline.StageHooks) -------------------------------------

    def progress(self, stage: str, fraction: float, detail: str) -> None:
        percent = round(max(0.0, min(1.0, fraction)) * 100, 1)
        now = time.monotonic()
        # Only mid-stage events are throttled against each other: the first one always shows, however fast the
        # stage runs after its start event, so every stage that reports progress shows that it moved.
        mid_stage = 0 < percent < 100
        if percent == self._last_percent or (mid_stage and now - self._last_progress_at < FLUSH_SECONDS):
            return
        self._last_percent = percent
        if mid_stage:
            self._last_progress_at = now
        runs.record_event(self.session, self.job_id, f"{stage}: {detail}", stage=self.stage, progress=percent)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._pending_metrics.append((step, values))
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def restore_metrics(self, metrics_file: Path, up_to_step: int) -> None:
        """Make the stage's series exactly the records of `metrics_file` up to `up_to_step` (a checkpoint's),
        before a resumed run replays the steps after it."""
        runs.discard_metrics(self.session, self.job_id, self.stage, 0)
        for record in StepRecord.lines(metrics_file):
            if record.step <= up_to_step:
                runs.record_metrics(self.session, self.job_id, record.step, step_metrics(record.values()),
                                    stage=self.stage)

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def flush(self) -> None:
        pending, self._pending_metrics = self._pending_metrics, []
        if pending and not self._replaced_older:  # a resumed stage replays steps an earlier attempt recorded
            runs.discard_metrics(self.session, self.job_id, self.stage, pending[0][0])
            self._replaced_older = True
        for step, values in pending:
            runs.record_metrics(self.session, self.job_id, step, values, stage=self.stage)
        self._last_flush = time.monotonic()

    # --- the heartbeat thread -------------------------------------------------------------------------

    def beat(self, session: Session) -> None:
        if draining(self.ctx):
            self.stop_reason = self.stop_reason or DRAINING
        if not runs.heartbeat(session, self.job_id, self.stage, self.ctx.worker_id):
            self.stop_reason = self.stop_reason or "the attempt was taken over or ended elsewhere"
        elif self.cancellation_requested(session):
            self.stop_reason = "cancellation requested"


class HeartbeatThread:
    """`beat(session)` every DRAFTSMITH_WORKER_HEARTBEAT_SECONDS on a thread with its own database session, from
    start() to stop(): what keeps a stage attempt, or a generate shard's claim (worker/shards.py), visibly alive
    while the work computes. A failing beat is logged and tried again at the next: a database blip must not stop
    the work."""

    def __init__(self, ctx: WorkerContext, name: str, beat: Callable[[Session], None]):
        self.ctx, self.beat = ctx, beat
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.ctx.session_factory() as session:
            while not self._done.wait(self.ctx.settings.worker_heartbeat_seconds):
                try:
                    self.beat(session)
                except Exception:
                    session.rollback()
                    log.warning("%s failed", self._thread.name, exc_info=True)
