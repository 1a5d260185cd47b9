"""What a worker process needs to do its work: settings, a database session factory, object storage, its
own id and a local cache. Built lazily once per process, after Celery forks its pool children, so no
database connection or client is ever shared across a fork."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from domain.db import Session, SessionTimeouts, create_db_engine, create_session_factory, sessionmaker
from domain.settings import Settings, load_settings
from domain.storage import LocalStorage, S3Storage, storage_from_settings


@dataclass
class WorkerContext:
    settings: Settings
    queues: frozenset[str]
    """The Celery queues this worker consumes; a stage whose queue is not among them is handed on."""

    @cached_property
    def session_factory(self) -> sessionmaker[Session]:
        # The worker's own database limits (longer statements than the API's; see Settings).
        return create_session_factory(create_db_engine(self.settings.database_url,
                                                       timeouts=SessionTimeouts.for_worker(self.settings)))

    @cached_property
    def storage(self) -> LocalStorage | S3Storage:
        return storage_from_settings(self.settings)

    @cached_property
    def worker_id(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    @property
    def cache(self) -> Path:
        return Path(self.settings.worker_cache_dir).resolve()

    def job_dir(self, job_id: str) -> Path:
        return self.cache / "jobs" / job_id


_contexts: dict[int, WorkerContext] = {}


def current_context(queues: frozenset[str] | None = None) -> WorkerContext:
    """This process's context (a forked child gets its own: the pid is part of the key)."""
    pid = os.getpid()
    if pid not in _contexts:
        from domain.queue import all_queues

        settings = load_settings()
        _contexts[pid] = WorkerContext(settings, queues or frozenset(os.environ.get(
            "DRAFTSMITH_WORKER_QUEUES", ",".join(all_queues(settings))).split(",")))
    return _contexts[pid]
