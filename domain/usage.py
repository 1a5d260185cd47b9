"""Usage and quotas per organisation: compute seconds, tokens generated, tokens trained.

The worker appends a `usage_records` row whenever a stage attempt or an audit ends (through
domain/runs.py `record_usage`, which calls `append_usage` here): the attempt's wall seconds times the devices
it held, the tokens the target generated (regeneration; validation and audits decode too) and the drafter tokens
trained (steps x sequences per step x anchors x block size, the estimate's unit). An organisation's usage in a
month is the sum of its records in that UTC calendar month.

Quotas are monthly limits on each counter: the organisation's own (`draftsmith keys create --monthly-...`), else
the deployment's default (`DRAFTSMITH_DEFAULT_MONTHLY_*`), else none. They are enforced when work is submitted
(a job, a resume, an audit): a counter at or above its limit answers 429 `quota-exceeded`, naming the limit,
the usage, and when the month resets. Work already admitted runs to its end, so a month can overshoot a
limit by what was in flight.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from domain.errors import QuotaExceeded
from domain.models import Job, Organisation, UsageRecord, utcnow
from domain.settings import Settings
from domain.states import ACTIVE_STATUSES

COUNTERS = ("compute_seconds", "tokens_generated", "tokens_trained")


def period_bounds(now: datetime | None = None) -> tuple[str, datetime, datetime]:
    """("YYYY-MM", first instant of the month, first instant of the next), UTC."""
    now = (now or utcnow()).astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return f"{now.year:04d}-{now.month:02d}", start, end


FIRST_PERIOD, LAST_PERIOD = "1970-01", "9999-11"
"""The months /v1/usage answers for: 9999-12 would end in year 10000, which no datetime (or column) holds."""
PERIOD_PATTERN = (r"^(?:19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(?:0[1-9]|1[0-2])$"
                  r"|^9999-(?:0[1-9]|1[01])$")
"""FIRST_PERIOD to LAST_PERIOD as YYYY-MM: how the OpenAPI document states what parse_period accepts (a test holds
the two to the same months)."""


def parse_period(period: str) -> tuple[str, datetime, datetime]:
    from domain.errors import FieldError, InvalidRequest

    try:
        when = datetime.strptime(period, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise InvalidRequest(f"period {period!r} must be a month as YYYY-MM, e.g. 2026-12",
                             errors=[FieldError(field="period", message="expected YYYY-MM")]) from None
    name = f"{when.year:04d}-{when.month:02d}"
    if not FIRST_PERIOD <= name <= LAST_PERIOD:
        message = f"must be a month from {FIRST_PERIOD} to {LAST_PERIOD}"
        raise InvalidRequest(f"period {period!r} {message}", errors=[FieldError(field="period", message=message)])
    return period_bounds(when)


def usage_between(session: Session, org_id: str, start: datetime, end: datetime) -> dict[str, float | int]:
    row = session.execute(
        select(func.coalesce(func.sum(UsageRecord.compute_seconds), 0.0),
               func.coalesce(func.sum(UsageRecord.tokens_generated), 0),
               func.coalesce(func.sum(UsageRecord.tokens_trained), 0))
        .where(UsageRecord.org_id == org_id, UsageRecord.recorded_at >= start, UsageRecord.recorded_at < end)
    ).one()
    return {"compute_seconds": round(float(row[0]), 1), "tokens_generated": int(row[1]), "tokens_trained": int(row[2])}


def limits_for(org: Organisation, settings: Settings) -> dict[str, int | None]:
    return {
        "compute_seconds": org.monthly_compute_seconds or settings.default_monthly_compute_seconds,
        "tokens_generated": org.monthly_tokens_generated or settings.default_monthly_tokens_generated,
        "tokens_trained": org.monthly_tokens_trained or settings.default_monthly_tokens_trained,
    }


def check_quota(session: Session, org: Organisation, settings: Settings, *, what: str) -> None:
    """Refuse new work (`what`: "job", "audit") once any counter of this month has reached its limit."""
    limits = limits_for(org, settings)
    if not any(limits.values()):
        return
    period, start, end = period_bounds()
    used = usage_between(session, org.id, start, end)
    for name in COUNTERS:
        limit = limits[name]
        if limit is not None and used[name] >= limit:
            retry_after = max(1, math.ceil((end - utcnow()).total_seconds()))
            raise QuotaExceeded(
                f"organisation {org.name!r} has used {used[name]:g} {name.replace('_', ' ')} in {period}, its "
                f"monthly limit is {limit:g} ({name}); no new {what} until the month resets at "
                f"{end.isoformat()} or the operator raises the limit",
                retry_after_seconds=retry_after,
                extra={"limit": name, "limit_value": limit, "used": used[name], "period": period,
                       "resets_at": end.isoformat()},
            )


def append_usage(session: Session, org_id: str, *, job_id: str | None = None, audit_id: str | None = None,
                 stage: str | None = None, compute_seconds: float = 0.0, tokens_generated: int = 0,
                 tokens_trained: int = 0) -> UsageRecord:
    """Append what one stage attempt or audit spent (does not commit)."""
    values = {"compute_seconds": compute_seconds, "tokens_generated": tokens_generated, "tokens_trained": tokens_trained}
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    row = UsageRecord(org_id=org_id, job_id=job_id, audit_id=audit_id, stage=stage,
                      compute_seconds=float(compute_seconds), tokens_generated=int(tokens_generated),
                      tokens_trained=int(tokens_trained))
    session.add(row)
    return row


def active_job_count(session: Session, org_id: str) -> int:
    """The organisation's jobs that hold a concurrency slot (not yet terminal), beside its limit on /v1/usage."""
    return session.scalar(select(func.count()).select_from(Job).where(
        Job.org_id == org_id, Job.status.in_([str(s) for s in ACTIVE_STATUSES]))) or 0
