"""/v1/jobs: create (idempotent), list, get, cancel, resume, estimate."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from api.deps import ReadPrincipal, ServicesDep, SessionDep, WritePrincipal, run_read, run_write
from api.estimates import GPU_CLASSES, estimate_job
from api.problems import problem_responses
from api.schemas import EstimateOut, JobList, JobOut, JobStatusName
from api.views import jobs_to_out
from domain.db import Connection, Session
from domain.errors import FieldError, InvalidRequest
from domain.job_reads import job_row_for_org, list_jobs
from domain.jobs import (
    JOB_ID_RE,
    QUEUED_PRESUMED_LOST_SECONDS,
    cancel_job,
    check_job_spec,
    create_job,
    parse_job_spec,
    resume_job,
)
from schemas.bounds import CONTROL_CHARACTERS, TARGET_PARAMETERS_BILLION_RANGE
from schemas.job_spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

StatusFilter = JobStatusName
GpuClassName = Literal["cpu-2core", "l4-24gb", "a10g-24gb", "a100-80gb", "h100-80gb", "h200-141gb"]
assert set(GpuClassName.__args__) == set(GPU_CLASSES)  # type: ignore[attr-defined]
_LABEL_KEY = r"[a-z0-9][a-z0-9_.-]{0,62}"
_LABEL_FILTER_RE = re.compile(rf"^({_LABEL_KEY}):(.{{0,256}})$", re.DOTALL)
# The filter as the OpenAPI document states it: with the app-wide refusal of control characters (api/edge.py).
LABEL_FILTER_PATTERN = rf"^{_LABEL_KEY}:[^{CONTROL_CHARACTERS}]{{0,256}}$"

# The body is validated by `job_spec_body` (it needs this deployment's allowed file roots as
# validation context, which FastAPI's own body parsing cannot pass), so describe it explicitly.
JOB_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}}},
    }
}


async def job_spec_body(request: Request, services: ServicesDep) -> JobSpec:
    return parse_job_spec(await request.body(), services.settings)


SpecBody = Annotated[JobSpec, Depends(job_spec_body)]

# A warm start naming a drafter id the organisation does not have is a 404 (domain/drafters.py check_warm_start),
# exactly like GET /v1/drafters/{id}: clients generated from the OpenAPI document must expect it here too.
UNKNOWN_DRAFTER = {404: {**problem_responses(404)[404], "description": "`init.from_drafter` names a drafter id "
                         "(drf_...) your organisation does not have; GET /v1/drafters lists yours"}}


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    summary="Create a job",
    openapi_extra=JOB_SPEC_BODY,
    responses={
        200: {"description": "Replay: a job with this Idempotency-Key and the same body already exists; "
                             "it is returned unchanged with header `Idempotent-Replayed: true`.",
              "model": JobOut},
        201: {"description": "Created and queued."},
        **problem_responses(400, 401, 403, 409, 413, 422, 429, 503),
        **UNKNOWN_DRAFTER,
    },
)
def create(
    principal: WritePrincipal,
    spec: SpecBody,
    session: SessionDep,
    services: ServicesDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", max_length=255,
               description="Retry-safe creation: the same key and body return the same job (200); "
                           "the same key with a different body is 409."),
    ] = None,
) -> JobOut:
    created = create_job(session, services.settings, services.queue, org_id=principal.org_id, spec=spec,
                         idempotency_key=idempotency_key)
    if created.replayed:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{created.job.id}"
    return jobs_to_out(session, [created.job])[0]


@router.get("", response_model=JobList, summary="List jobs, newest first",
            responses=problem_responses(401, 403, 422))
async def list_(
    principal: ReadPrincipal,
    services: ServicesDep,
    status: Annotated[list[StatusFilter] | None, Query(description="Keep jobs in any of these states.")] = None,
    label: Annotated[
        list[str] | None, Query(description="`key:value`; repeat to require several labels.", max_length=16,
                                json_schema_extra={"pattern": LABEL_FILTER_PATTERN})
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="Cursor: `next_cursor` of the previous page.", max_length=64,
                                       json_schema_extra={"pattern": JOB_ID_RE.pattern})] = None,
) -> JobList:
    labels = []
    for item in label or []:
        match = _LABEL_FILTER_RE.match(item)
        if not match:
            raise InvalidRequest(
                f"label filter {item!r} must be key:value with a label key like `team`",
                errors=[FieldError(field="label", message="expected key:value")],
            )
        labels.append((match.group(1), match.group(2)))
    if after is not None and not JOB_ID_RE.match(after):
        raise InvalidRequest("`after` must be a job id taken from next_cursor",
                             errors=[FieldError(field="after", message="not a job id")])
    # A hot read route: async, with its database work in one thread hop (api/deps.py run_read).
    return await run_read(services, _job_page, principal.org_id, list(status or []), labels, limit, after)


def _job_page(db: Connection, org_id: str, statuses: list[str], labels: list[tuple[str, str]], limit: int,
              after: str | None) -> JobList:
    jobs, has_more = list_jobs(db, org_id, statuses=statuses, labels=labels, limit=limit, after=after)
    return JobList(data=jobs_to_out(db, jobs), has_more=has_more,
                   next_cursor=jobs[-1].id if has_more and jobs else None)


@router.post(
    "/estimate",
    response_model=EstimateOut,
    summary="Estimate tokens, steps, time and cost of a job without creating it",
    openapi_extra=JOB_SPEC_BODY,
    responses={**problem_responses(401, 403, 413, 422), **UNKNOWN_DRAFTER},
)
def estimate(
    principal: ReadPrincipal,
    spec: SpecBody,
    session: SessionDep,
    services: ServicesDep,
    gpu_class: Annotated[GpuClassName | None, Query(description="One class; default: all classes.")] = None,
    gpu_count: Annotated[int, Query(ge=1, le=64)] = 1,
    target_parameters_billion: Annotated[
        float | None,
        Query(ge=TARGET_PARAMETERS_BILLION_RANGE[0], le=TARGET_PARAMETERS_BILLION_RANGE[1],
              description="Target size in billions of parameters; default from the bundled table or model name."),
    ] = None,
    target_active_parameters_billion: Annotated[
        float | None,
        Query(ge=TARGET_PARAMETERS_BILLION_RANGE[0], le=TARGET_PARAMETERS_BILLION_RANGE[1],
              description="A mixture of experts' active parameters in billions (time scales with them, memory "
              "with the whole size); default from the model name (`-A3B`), else the whole size."),
    ] = None,
) -> EstimateOut:
    # Whatever would refuse the job refuses its estimate (and an uploaded file is counted, not guessed).
    uploaded = check_job_spec(session, services.settings, principal.org_id, spec)
    return estimate_job(spec, gpu_class=gpu_class, gpu_count=gpu_count,
                        target_parameters_billion=target_parameters_billion, uploaded_prompts=uploaded,
                        target_active_parameters_billion=target_active_parameters_billion)


@router.get("/{job_id}", response_model=JobOut, summary="Get a job", responses=problem_responses(401, 403, 404))
async def get(principal: ReadPrincipal, services: ServicesDep, job_id: str) -> JobOut:
    return await run_read(services, _job, principal.org_id, job_id)  # one thread hop (api/deps.py run_read)


def _job(db: Connection, org_id: str, job_id: str) -> JobOut:
    return jobs_to_out(db, [job_row_for_org(db, org_id, job_id)])[0]


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    summary="Cancel a job",
    description="A queued job is cancelled at once; a running one becomes `cancelling` until the worker stops "
    "at a safe point. Cancelling a cancelling/cancelled job is a no-op; a finished job answers 409. 503 (with "
    "`Retry-After`) when the job's row stays locked by another change for seconds.",
    responses=problem_responses(401, 403, 404, 409, 503),
)
async def cancel(principal: WritePrincipal, services: ServicesDep, job_id: str) -> JobOut:
    # One thread hop whose session ends before the answer is validated (api/deps.py run_write): the cancel locks
    # the job's row, and concurrent cancels of one job wait for that lock on worker threads.
    return await run_write(services, _cancelled_job_out, principal.org_id, job_id)


def _cancelled_job_out(session: Session, org_id: str, job_id: str) -> JobOut:
    return jobs_to_out(session, [cancel_job(session, org_id, job_id)])[0]


@router.post(
    "/{job_id}/resume",
    response_model=JobOut,
    summary="Resume a failed or cancelled job, or a queued one whose message was lost",
    description="Queues the job again; the worker restarts at the first stage that has not succeeded "
    "(the failed or cancelled one). Finished stages are not rerun. A job still `queued` (or `waiting`: its worker "
    "went quiet and it was queued again) with no sign of a worker "
    f"for {QUEUED_PRESUMED_LOST_SECONDS} s (nothing changed on it: no worker picked it up, no event) is presumed "
    "to have lost its broker message: resume sends it again (a `job.resumed` event with `requeued: true`); "
    "sooner it is 409 with `Retry-After`.",
    responses=problem_responses(401, 403, 404, 409, 429, 503),
)
def resume(principal: WritePrincipal, session: SessionDep, services: ServicesDep, job_id: str) -> JobOut:
    job = resume_job(session, services.settings, services.queue, principal.org_id, job_id)
    return jobs_to_out(session, [job])[0]
