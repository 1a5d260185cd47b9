"""Handing jobs to the worker: by Celery task *name*, never by importing the worker.

    send_task("draftsmith.run_job", args=[job_id], queue=queue_for(settings, stage))

The worker defines the task `draftsmith.run_job(job_id)`. Stages that need the accelerator run from the
`<queue_name>.gpu` queue, packaging and uploads from `<queue_name>.cpu` (schemas/stages.py): a job is sent
to the queue of the stage it starts at, and the worker hands it on when the next stage's queue differs.
The worker reads everything else (spec, next stage) from the database, which is the source of truth.
With `DRAFTSMITH_BROKER_URL=disabled` jobs go to an in-memory recorder instead (tests, or an API
that only records jobs). `celery_broker_options` is shared so the worker configures the embedded
`filesystem://` transport exactly as the API does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from domain.settings import Settings
from schemas.stages import STAGE_QUEUE, Stage

RUN_JOB_TASK = "draftsmith.run_job"
GENERATE_SHARDS_TASK = "draftsmith.generate_shards"
"""A helper of a job's generate stage spread over several workers (worker/shards.py): claims and writes shards."""
RUN_AUDIT_TASK = "draftsmith.run_audit"
"""A drift audit (domain/audits.py): loads the target and measures a drafter, so it runs from the gpu queue."""


def queue_for(settings: Settings, stage: Stage | str) -> str:
    return f"{settings.queue_name}.{STAGE_QUEUE[Stage(stage)]}"


def all_queues(settings: Settings) -> list[str]:
    return sorted({queue_for(settings, stage) for stage in Stage})


def audit_queue(settings: Settings) -> str:
    return f"{settings.queue_name}.gpu"


class RecordingQueue:
    """Broker disabled: remembers what would have been sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[tuple[str, list[Any]]] = []
        self.stages: list[str] = []

    def enqueue_job(self, job_id: str, stage: Stage | str = Stage.PREPARE) -> None:
        with self._lock:
            self.sent.append((RUN_JOB_TASK, [job_id]))
            self.stages.append(str(stage))

    def enqueue_audit(self, audit_id: str) -> None:
        with self._lock:
            self.sent.append((RUN_AUDIT_TASK, [audit_id]))
            self.stages.append("audit")

    def ping(self) -> None:
        return None

    def job_ids(self) -> list[str]:
        with self._lock:
            return [args[0] for task, args in self.sent if task == RUN_JOB_TASK]


def celery_broker_options(settings: Settings) -> dict[str, Any]:
    """Celery configuration for the broker, identical on the API (producer) and worker (consumer)."""
    options: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_timeout": 3,
        "broker_connection_retry_on_startup": False,
        # A POST must not hang on a dead broker: give up quickly and report 503.
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
    }
    if settings.broker_url.startswith("filesystem://"):
        folder = Path(settings.broker_folder).resolve()
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        options["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # kombu's default control folder is ./control, relative to whatever the cwd is.
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    else:
        options["broker_transport_options"] = {
            "socket_connect_timeout": 3, "socket_timeout": 5,
            # Redis redelivers an unacknowledged task after this long: it must outlast the longest stage, or a
            # second worker would start a job the first is still running (the heartbeat guards that too).
            "visibility_timeout": settings.broker_visibility_timeout_seconds,
        }
    return options


class CeleryQueue:
    def __init__(self, settings: Settings) -> None:
        from celery import Celery  # the Celery client only; the worker's task modules are never imported

        self.settings = settings
        self.app = Celery("draftsmith-api", set_as_current=False)
        self.app.conf.update(celery_broker_options(settings))

    def enqueue_job(self, job_id: str, stage: Stage | str = Stage.PREPARE) -> None:
        self.app.send_task(RUN_JOB_TASK, args=[job_id], queue=queue_for(self.settings, stage), retry=True)

    def enqueue_audit(self, audit_id: str) -> None:
        self.app.send_task(RUN_AUDIT_TASK, args=[audit_id], queue=audit_queue(self.settings), retry=True)

    def ping(self) -> None:
        with self.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=3)


def queue_from_settings(settings: Settings) -> RecordingQueue | CeleryQueue:
    if not settings.broker_enabled:
        return RecordingQueue()
    return CeleryQueue(settings)
