"""/v1/audits: drift audits of a drafter against a (new) target checkpoint; /v1/audit-thresholds: the
organisation's rule for keep / warm start / retrain."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from api.deps import AdminPrincipal, ReadPrincipal, ServicesDep, SessionDep, WritePrincipal, run_write
from api.problems import problem_responses
from api.schemas import AuditList, AuditOut
from api.views import audit_out
from domain.audits import (
    audit_thresholds_of,
    cancel_audit,
    create_audit,
    get_audit_for_org,
    list_audits,
    parse_audit_spec,
    set_audit_thresholds,
)
from domain.db import Session
from domain.errors import FieldError, InvalidRequest
from schemas.audit import AuditSpec, AuditThresholds

router = APIRouter(tags=["audits"])
_AUDIT_ID_RE = re.compile(r"^aud_[0-9A-Z]{26}$")
AUDIT_SPEC_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/AuditSpec"}}}}}


async def audit_spec_body(request: Request, services: ServicesDep) -> AuditSpec:
    return parse_audit_spec(await request.body(), services.settings)


@router.post(
    "/v1/audits", status_code=201, response_model=AuditOut, summary="Audit a drafter against a target checkpoint",
    description="Measures an existing drafter (`drf_...` or a drafter URI) against a target checkpoint on a prompt "
    "sample: compatibility (hidden size, vocabulary, taps, fingerprint), the lossless checks, tau overall, per "
    "position and per category, and a recommendation (keep, warm_start, retrain) by the organisation's "
    "thresholds. Runs on a worker in minutes; poll `GET /v1/audits/{id}`. An incompatible drafter or an "
    "unreachable checkpoint ends the audit `failed` with an error naming the mismatch. An active audit counts "
    "against the organisation's limit on active work, together with its jobs (429 `concurrency-limit`).",
    openapi_extra=AUDIT_SPEC_BODY, responses=problem_responses(401, 403, 404, 413, 422, 429, 503))
def create(principal: WritePrincipal, session: SessionDep, services: ServicesDep, response: Response,
           spec: Annotated[AuditSpec, Depends(audit_spec_body)]) -> AuditOut:
    row = create_audit(session, services.settings, services.queue, org_id=principal.org_id, spec=spec)
    response.headers["Location"] = f"/v1/audits/{row.id}"
    return audit_out(row)


@router.get("/v1/audits", response_model=AuditList, summary="List audits, newest first",
            responses=problem_responses(401, 403, 422))
def list_(principal: ReadPrincipal, session: SessionDep,
          drafter: Annotated[str | None, Query(max_length=2048, description="Only audits of this drafter.")] = None,
          limit: Annotated[int, Query(ge=1, le=100)] = 20,
          after: Annotated[str | None, Query(max_length=64, description="Cursor: `next_cursor` of the previous page.",
                                             json_schema_extra={"pattern": _AUDIT_ID_RE.pattern})] = None
          ) -> AuditList:
    if after is not None and not _AUDIT_ID_RE.match(after):
        raise InvalidRequest("`after` must be an audit id taken from next_cursor",
                             errors=[FieldError(field="after", message="not an audit id")])
    rows, has_more = list_audits(session, principal.org_id, limit=limit, after=after, drafter=drafter)
    return AuditList(data=[audit_out(row) for row in rows], has_more=has_more,
                     next_cursor=rows[-1].id if has_more and rows else None)


@router.get("/v1/audits/{audit_id}", response_model=AuditOut, summary="Get an audit",
            responses=problem_responses(401, 403, 404))
def get(principal: ReadPrincipal, session: SessionDep, audit_id: str) -> AuditOut:
    return audit_out(get_audit_for_org(session, principal.org_id, audit_id))


@router.post(
    "/v1/audits/{audit_id}/cancel", response_model=AuditOut, summary="Cancel an audit",
    description="A queued audit is cancelled at once and never starts; a running one becomes `cancelling` until its "
    "worker stops, within seconds, and then `cancelled`. Cancelling a cancelling/cancelled audit is a no-op; a "
    "finished one (succeeded, failed) answers 409 `invalid-transition`. 503 (with `Retry-After`) when the audit's "
    "row stays locked by another change for seconds.",
    responses=problem_responses(401, 403, 404, 409, 503))
async def cancel(principal: WritePrincipal, services: ServicesDep, audit_id: str) -> AuditOut:
    # One thread hop whose session ends before the answer is validated (api/deps.py run_write), as for jobs.
    return await run_write(services, _cancelled_audit_out, principal.org_id, audit_id)


def _cancelled_audit_out(session: Session, org_id: str, audit_id: str) -> AuditOut:
    return audit_out(cancel_audit(session, org_id, audit_id))


@router.get("/v1/audit-thresholds", response_model=AuditThresholds, summary="The organisation's audit thresholds",
            responses=problem_responses(401, 403))
def get_thresholds(principal: ReadPrincipal, session: SessionDep) -> AuditThresholds:
    return audit_thresholds_of(session, principal.org_id)


@router.put("/v1/audit-thresholds", response_model=AuditThresholds, summary="Set the organisation's audit thresholds",
            description="keep at gain ratio >= keep_min_gain_ratio (and tau >= min_tau, if set), warm_start at >= "
            "warm_start_min_gain_ratio, retrain below; gain ratio = (tau - 1) / (reference tau - 1).",
            responses=problem_responses(401, 403, 422))
def put_thresholds(principal: AdminPrincipal, session: SessionDep, thresholds: AuditThresholds) -> AuditThresholds:
    return set_audit_thresholds(session, principal.org_id, thresholds)
