"""Outgoing webhooks: the rule that queues them, the endpoints and their delivery log.

Delivery is an outbox: a job transition (domain/states.py `transition`) inserts `webhook_deliveries` rows through
`enqueue_job_webhooks` in the same transaction as the state change, and domain/deliveries.py sends them later, so a
crash between "state changed" and "HTTP sent" loses nothing. This module holds no HTTP client: everything that
changes a job's state imports it (the worker's every stage), and only the dispatcher needs one.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from domain.drafters import rollout_summary
from domain.errors import FieldError, InvalidRequest
from domain.keys import lock_organisation
from domain.models import Job, JobLabel, Webhook, WebhookAttempt, WebhookDelivery, utcnow
from domain.statuses import JobStatus

WEBHOOK_EVENT_TYPES = ("job.started", "job.stage_changed", "job.succeeded", "job.failed", "job.cancelled")
SECRET_PREFIX = "whsec_"


def new_webhook_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def job_summary(session: Session, job: Job) -> dict[str, Any]:
    labels = {
        row.key: row.value for row in session.scalars(select(JobLabel).where(JobLabel.job_id == job.id))
    }
    error = (
        {"code": job.error_code, "message": job.error_message, "stage": job.error_stage}
        if job.error_code
        else None
    )
    summary = {
        "id": job.id,
        "object": "job",
        "status": job.status,
        "stage": job.stage,
        "name": job.name,
        "labels": labels,
        "error": error,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
    if job.status == JobStatus.SUCCEEDED:
        # What a deployment system rolls out: drafter id and parent, target, lossless verdict, tau, serving
        # settings, artifacts with sha256, publications (domain/drafters.py).
        summary["drafter"] = rollout_summary(session, job)
    return summary


def enqueue_job_webhooks(session: Session, job: Job, event_type: str, *, extra: dict[str, Any] | None = None) -> int:
    """Insert one pending delivery per enabled endpoint of the job's organisation that wants `event_type`."""
    if event_type not in WEBHOOK_EVENT_TYPES:
        raise ValueError(f"unknown webhook event {event_type!r}")
    hooks = [
        hook
        for hook in session.scalars(select(Webhook).where(Webhook.org_id == job.org_id, Webhook.enabled.is_(True)))
        if event_type in hook.event_types
    ]
    if not hooks:
        return 0
    now = utcnow()
    data = job_summary(session, job) | (extra or {})
    payload = json.dumps(
        {"type": event_type, "timestamp": now.isoformat(), "data": data}, separators=(",", ":"), sort_keys=True
    )
    for hook in hooks:
        session.add(
            WebhookDelivery(
                webhook_id=hook.id, job_id=job.id, event_type=event_type, payload=payload,
                status="pending", attempt_count=0, next_attempt_at=now, created_at=now,
            )
        )
    return len(hooks)


MAX_WEBHOOKS_PER_ORG = 20
WEBHOOK_FIELDS = ("url", "event_types", "description", "enabled")
"""What a change to an endpoint may set (`change_webhook`)."""


def add_webhook(session: Session, org_id: str, *, url: str, events: Iterable[str], description: str | None,
                enabled: bool) -> Webhook:
    """Register an endpoint (its URL already judged by the egress policy) with a new signing secret; committed.
    Counted and inserted in one transaction under the organisation's lock: concurrent creates cannot all see room
    for one more (without the lock, 40 creates at once stored 21 against the limit of 20)."""
    lock_organisation(session, org_id)
    if count_webhooks(session, org_id) >= MAX_WEBHOOKS_PER_ORG:
        raise InvalidRequest(f"an organisation may have at most {MAX_WEBHOOKS_PER_ORG} webhooks; delete one first",
                             errors=[FieldError(field="url", message="too many webhooks")])
    hook = Webhook(org_id=org_id, url=url, secret=new_webhook_secret(), event_types=sorted(set(events)),
                   description=description, enabled=enabled)
    session.add(hook)
    session.commit()
    return hook


def change_webhook(session: Session, hook: Webhook, **changes: Any) -> Webhook:
    """Set the given `WEBHOOK_FIELDS` of an endpoint (event types kept sorted and unique) and its updated_at;
    committed."""
    unknown = set(changes) - set(WEBHOOK_FIELDS)
    if unknown:
        raise ValueError(f"a webhook has no field {sorted(unknown)} to change; known: {', '.join(WEBHOOK_FIELDS)}")
    if "event_types" in changes:
        changes["event_types"] = sorted(set(changes["event_types"]))
    for field, value in changes.items():
        setattr(hook, field, value)
    hook.updated_at = utcnow()
    session.commit()
    return hook


def remove_webhook(session: Session, hook: Webhook) -> None:
    """Delete an endpoint (its deliveries and their attempts go with it); committed."""
    session.delete(hook)
    session.commit()


def webhook_for_org(session: Session, org_id: str, webhook_id: str) -> Webhook | None:
    return session.scalar(select(Webhook).where(Webhook.id == webhook_id, Webhook.org_id == org_id))


def count_webhooks(session: Session, org_id: str) -> int:
    return session.scalar(select(func.count()).select_from(Webhook).where(Webhook.org_id == org_id)) or 0


def webhooks_of(session: Session, org_id: str) -> list[Webhook]:
    return list(session.scalars(select(Webhook).where(Webhook.org_id == org_id).order_by(Webhook.id)))


def recent_deliveries(session: Session, webhook_id: str, limit: int = 100
                      ) -> list[tuple[WebhookDelivery, list[WebhookAttempt]]]:
    """An endpoint's latest deliveries, newest first, each with its attempts in order (two queries)."""
    deliveries = list(session.scalars(
        select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.id.desc()).limit(limit)
    ))
    attempts: dict[str, list[WebhookAttempt]] = defaultdict(list)
    if deliveries:
        for attempt in session.scalars(
            select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_([d.id for d in deliveries]))
            .order_by(WebhookAttempt.attempt)
        ):
            attempts[attempt.delivery_id].append(attempt)
    return [(delivery, attempts[delivery.id]) for delivery in deliveries]


def deliveries_by_status(session: Session) -> dict[str, int]:
    """How many deliveries are in each status, all organisations (the API's Prometheus gauge)."""
    return dict(session.execute(
        select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status)).all())
