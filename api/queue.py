"""Handing jobs to the worker: by Celery task *name*, never by importing the worker.

    send_task("draftsmith.run_job", args=[job_id], queue=settings.queue_name)

The worker defines the task `draftsmith.run_job(job_id)` and consumes `settings.queue_name`;
it reads everything else (spec, next stage) from the database, which is the source of truth.
With `DRAFTSMITH_BROKER_URL=disabled` jobs go to an in-memory recorder instead (tests, or an API
that only records jobs). `celery_broker_options` is shared so the worker configures the embedded
`filesystem://` transport exactly as the API does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from api.settings import Settings

RUN_JOB_TASK = "draftsmith.run_job"


class JobQueue(Protocol):
    def enqueue_job(self, job_id: str) -> None: ...
    def ping(self) -> None: ...


class RecordingQueue:
    """Broker disabled: remembers what would have been sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[tuple[str, list[Any]]] = []

    def enqueue_job(self, job_id: str) -> None:
        with self._lock:
            self.sent.append((RUN_JOB_TASK, [job_id]))

    def ping(self) -> None:
        return None

    def job_ids(self) -> list[str]:
        with self._lock:
            return [args[0] for _, args in self.sent]


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
        options["broker_transport_options"] = {"socket_connect_timeout": 3, "socket_timeout": 5}
    return options


class CeleryQueue:
    def __init__(self, settings: Settings) -> None:
        from celery import Celery  # the Celery client only; the worker's task modules are never imported

        self.queue_name = settings.queue_name
        self.app = Celery("draftsmith-api", set_as_current=False)
        self.app.conf.update(celery_broker_options(settings))

    def enqueue_job(self, job_id: str) -> None:
        self.app.send_task(RUN_JOB_TASK, args=[job_id], queue=self.queue_name, retry=True)

    def ping(self) -> None:
        with self.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=3)


def queue_from_settings(settings: Settings) -> RecordingQueue | CeleryQueue:
    if not settings.broker_enabled:
        return RecordingQueue()
    return CeleryQueue(settings)
