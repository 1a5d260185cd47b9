"""The status names a job, a stage run and an audit can hold: the one list of each.

`JobStatus` is the job's (domain/states.py holds the transitions between them), `StageRunStatus` one stage
attempt's (domain/runs.py writes them), `AuditStatus` an audit's (domain/audits.py). All are stored as plain strings (String(16) columns, no database enum type: a new status
needs no migration); the API's response models and filters derive their `Literal`s from these enums. This module
imports nothing of the domain, so every other domain module (the webhook rule and drafter queries included, which
domain/states.py itself imports) can name a status without an import circle.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    GENERATING = "generating"
    TRAINING = "training"
    VALIDATING = "validating"
    EXPORTING = "exporting"
    PUBLISHING = "publishing"
    WAITING = "waiting"
    """Its worker went quiet mid-stage: the reaper re-queued it once, and it waits for a free worker to resume it."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


JOB_STATUS_TEXT: dict[JobStatus, str] = {JobStatus.WAITING: "waiting for a worker"}
"""A status in words where its name alone says too little: the API's `status_text` (what the CLI and the dashboard
show); every other status reads as its name."""


def job_status_text(status: str) -> str:
    return JOB_STATUS_TEXT.get(JobStatus(status), status)


class StageRunStatus(StrEnum):
    """One attempt at one stage (a `stage_runs` row): running → succeeded | failed | cancelled, or abandoned when
    its worker released it, went quiet, or a redelivered task claimed the stage again."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"


class AuditStatus(StrEnum):
    """queued → running → succeeded | failed; cancelling → cancelled when the user cancels a running one (a queued
    one is cancelled at once); a running audit whose worker went quiet is queued again or failed (worker_lost)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


AUDIT_ACTIVE_STATUSES: tuple[str, ...] = (AuditStatus.QUEUED.value, AuditStatus.RUNNING.value,
                                          AuditStatus.CANCELLING.value)
"""An audit in one of these holds one of the organisation's concurrency slots (domain/jobs.py counts them)."""
