"""Sending webhooks, signed as Standard Webhooks (https://www.standardwebhooks.com): the outbox's dispatcher.

domain/webhooks.py queues a delivery row when a job changes state; `dispatch_due_webhooks` here sends the due ones
later. Each POST carries

    webhook-id:        msg_...   (the delivery id: identical on every retry, for receiver dedup)
    webhook-timestamp: unix seconds of this attempt
    webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>

where `key` is the base64-decoded part of the endpoint's `whsec_...` secret. Failed attempts are
retried with exponential backoff (base × 2^(n-1), capped) up to `webhook_max_attempts`; every
attempt is a `webhook_attempts` row.

The dispatcher runs in one place: the API process, on a timer (api/main.py `_webhook_loop`, every
`DRAFTSMITH_WEBHOOK_DISPATCH_INTERVAL_SECONDS`; 0 turns it off). Claims (a conditional UPDATE per delivery) make
several API processes safe side by side. This module is the only one that imports httpx for webhooks: the worker
changes job states (which queues deliveries) but never sends them, so it never loads it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from datetime import datetime, timedelta

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from domain.db import execute_dml
from domain.egress import EgressPolicy, EgressRefused, outbound_client, send_pinned
from domain.models import Webhook, WebhookAttempt, WebhookDelivery, utcnow
from domain.redaction import redact_url
from domain.settings import Settings
from domain.webhooks import SECRET_PREFIX

CLAIM_SECONDS = 60  # a claimed delivery is retried by someone else if its sender vanished this long
log = logging.getLogger("draftsmith.webhooks")


def sign_payload(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The `webhook-signature` header value for one attempt."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def backoff_seconds(attempt: int, settings: Settings) -> float:
    """Delay before attempt `attempt + 1`, after `attempt` failures."""
    return min(settings.webhook_backoff_base_seconds * 2.0 ** (attempt - 1), settings.webhook_backoff_max_seconds)


def _claim_due(factory: sessionmaker[Session], now: datetime, limit: int) -> list[str]:
    claimed: list[str] = []
    with factory() as session:
        due = session.scalars(
            select(WebhookDelivery.id)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
                or_(WebhookDelivery.locked_until.is_(None), WebhookDelivery.locked_until < now),
            )
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        ).all()
        for delivery_id in due:
            # Conditional UPDATE: only one dispatcher's claim matches, the others see rowcount 0.
            result = execute_dml(session,
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == delivery_id,
                    WebhookDelivery.status == "pending",
                    or_(WebhookDelivery.locked_until.is_(None), WebhookDelivery.locked_until < now),
                )
                .values(locked_until=now + timedelta(seconds=CLAIM_SECONDS))
                .execution_options(synchronize_session=False)
            )
            if result.rowcount == 1:
                claimed.append(delivery_id)
        session.commit()
    return claimed


def _send(client: httpx.Client, url: str, secret: str, delivery: WebhookDelivery,
          settings: Settings) -> tuple[int | None, str | None, int]:
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": "Draftsmith-Webhooks/1",
        "webhook-id": delivery.id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_payload(secret, delivery.id, timestamp, delivery.payload),
    }
    started = time.perf_counter()
    try:
        # Resolved and checked at every attempt (DNS may have changed since registration), then sent to
        # the very address that was checked.
        target = EgressPolicy.from_settings(settings).check_url(url)
        response = send_pinned(client, target, content=delivery.payload.encode(), headers=headers)
        status, error = response.status_code, None
    except EgressRefused as exc:
        status, error = None, f"refused: {exc}"[:500]
    except httpx.HTTPError as exc:
        status, error = None, f"{type(exc).__name__}: {exc}"[:500]
    return status, error, int((time.perf_counter() - started) * 1000)


def dispatch_due_webhooks(
    factory: sessionmaker[Session],
    settings: Settings,
    *,
    now: datetime | None = None,
    client: httpx.Client | None = None,
    limit: int = 50,
) -> int:
    """Send every due delivery once; return how many attempts were made. `now` is injectable for tests."""
    now = now or utcnow()
    claimed = _claim_due(factory, now, limit)
    if not claimed:
        return 0
    own_client = client is None
    http = client or outbound_client(settings.webhook_timeout_seconds)
    try:
        for delivery_id in claimed:
            with factory() as session:
                delivery = session.get(WebhookDelivery, delivery_id)
                hook = session.get(Webhook, delivery.webhook_id) if delivery else None
                if delivery is None or hook is None:
                    continue
                url, secret = hook.url, hook.secret
            status, error, duration_ms = _send(http, url, secret, delivery, settings)
            succeeded = status is not None and 200 <= status < 300
            with factory() as session:
                delivery = session.get(WebhookDelivery, delivery_id)
                if delivery is None:  # endpoint deleted while we were sending
                    continue
                delivery.attempt_count += 1
                session.add(
                    WebhookAttempt(
                        delivery_id=delivery.id, attempt=delivery.attempt_count, attempted_at=now,
                        status_code=status, error=error or (None if succeeded else f"HTTP {status}"),
                        duration_ms=duration_ms, succeeded=succeeded,
                    )
                )
                delivery.locked_until = None
                if succeeded:
                    delivery.status, delivery.next_attempt_at = "succeeded", None
                elif delivery.attempt_count >= settings.webhook_max_attempts:
                    delivery.status, delivery.next_attempt_at = "failed", None
                    log.warning("webhook %s to %s failed after %d attempts", delivery.id, redact_url(url),
                                delivery.attempt_count)
                else:
                    delay = backoff_seconds(delivery.attempt_count, settings)
                    delivery.next_attempt_at = now + timedelta(seconds=delay)
                session.commit()
    finally:
        if own_client:
            http.close()
    return len(claimed)
