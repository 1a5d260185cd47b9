"""/v1/drafters: an organisation's published drafters, with their lineage and metrics, and each one's chain of
parents (domain/drafters.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import ReadPrincipal, SessionDep
from api.problems import problem_responses
from api.schemas import DrafterDetail, DrafterList
from api.views import drafter_detail, drafters_out
from domain.drafters import list_drafters
from domain.errors import FieldError, InvalidRequest
from schemas.job_spec import DRAFTER_ID_RE

router = APIRouter(prefix="/v1/drafters", tags=["drafters"])


@router.get("", response_model=DrafterList, summary="List published drafters, newest first",
            responses=problem_responses(401, 403, 422))
def list_(principal: ReadPrincipal, session: SessionDep,
          target_uri: Annotated[str | None, Query(max_length=2048, description="Only drafters for this target URI.")] = None,
          target_fingerprint: Annotated[str | None, Query(max_length=80)] = None,
          job_id: Annotated[str | None, Query(max_length=64, description="The drafter a job published.")] = None,
          limit: Annotated[int, Query(ge=1, le=100)] = 20,
          after: Annotated[str | None, Query(max_length=64, description="Cursor: `next_cursor` of the previous page.",
                                             json_schema_extra={"pattern": DRAFTER_ID_RE.pattern})] = None
          ) -> DrafterList:
    if after is not None and not DRAFTER_ID_RE.match(after):
        raise InvalidRequest("`after` must be a drafter id taken from next_cursor",
                             errors=[FieldError(field="after", message="not a drafter id")])
    rows, has_more = list_drafters(session, principal.org_id, limit=limit, after=after,
                                   target_fingerprint=target_fingerprint, target_uri=target_uri, job_id=job_id)
    return DrafterList(data=drafters_out(session, rows), has_more=has_more,
                       next_cursor=rows[-1].id if has_more and rows else None)


@router.get("/{drafter_id}", response_model=DrafterDetail, summary="Get a drafter, its lineage and its chain",
            responses={**problem_responses(401, 403),
                       404: {**problem_responses(404)[404], "description": "No drafter with this id in your "
                             "organisation (another organisation's answers the same); GET /v1/drafters lists yours"}})
def get(principal: ReadPrincipal, session: SessionDep, drafter_id: str) -> DrafterDetail:
    return drafter_detail(session, principal.org_id, drafter_id)
