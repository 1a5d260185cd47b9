"""/v1/usage: the organisation's compute seconds and tokens this month (or another), beside its quotas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.deps import ReadPrincipal, ServicesDep, SessionDep
from api.problems import problem_responses
from domain.keys import get_organisation
from domain.usage import (
    PERIOD_PATTERN,
    active_job_count,
    limits_for,
    parse_period,
    period_bounds,
    usage_between,
)

router = APIRouter(prefix="/v1/usage", tags=["usage"])


class UsageCounters(BaseModel):
    compute_seconds: float = Field(description="Wall seconds of stage attempts and audits x the devices they held.")
    tokens_generated: int = Field(description="Tokens the targets generated: regeneration, validation, audits.")
    tokens_trained: int = Field(description="Drafter tokens trained: steps x sequences x anchors x block size.")


class UsageLimits(BaseModel):
    compute_seconds: int | None
    tokens_generated: int | None
    tokens_trained: int | None


class UsageOut(BaseModel):
    object: Literal["usage"] = "usage"
    period: str = Field(description="The UTC calendar month, YYYY-MM.")
    period_start: datetime
    resets_at: datetime
    usage: UsageCounters
    limits: UsageLimits = Field(description="Monthly quotas (null: none); new work is refused (429 quota-exceeded) "
                                "once a counter reaches its limit.")
    active_jobs: int
    max_concurrent_jobs: int


@router.get("", response_model=UsageOut, summary="Usage and quotas", responses=problem_responses(401, 403, 422))
def usage(principal: ReadPrincipal, session: SessionDep, services: ServicesDep,
          period: Annotated[str | None, Query(max_length=7, description="YYYY-MM; default: this month.",
                                              json_schema_extra={"pattern": PERIOD_PATTERN})] = None
          ) -> UsageOut:
    name, start, end = parse_period(period) if period else period_bounds()
    org = get_organisation(session, principal.org_id)
    return UsageOut(period=name, period_start=start, resets_at=end,
                    usage=UsageCounters(**usage_between(session, org.id, start, end)),
                    limits=UsageLimits(**limits_for(org, services.settings)),
                    active_jobs=active_job_count(session, org.id),
                    max_concurrent_jobs=org.max_concurrent_jobs or services.settings.default_max_concurrent_jobs)
