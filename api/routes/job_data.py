"""/v1/jobs/{id}/events (paged JSON or live SSE), /metrics (downsampled), /artifacts (download)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool

from api.deps import ReadPrincipal, Services, ServicesDep, SessionDep, read_sessions, run_read
from api.event_feed import EventFeeds
from api.problems import problem_responses
from api.schemas import ArtifactList, ArtifactOut, EventList, EventOut, MetricPointOut, MetricSeries, MetricsOut
from domain.artifacts import artifact_named, artifacts_of
from domain.db import Connection, Row
from domain.errors import FieldError, InvalidRequest, NotFound
from domain.events import events_after, job_events_page
from domain.job_reads import job_state_for_org, job_status
from domain.jobs import get_job_for_org
from domain.metrics import metric_series
from domain.models import Artifact
from domain.states import TERMINAL_STATUSES, JobStatus

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job data"])
SSE_BATCH = 500
EVENT_CURSOR_MAX = 2**62  # the bound of `after` too: within any 64-bit column, with room for `+ 1`
EVENT_ID_MAX = 2**31 - 1  # job_events.seq is a 32-bit integer column


_EVENTS_OUT = TypeAdapter(list[EventOut])


def _events_out(events: list[Row[Any]]) -> list[EventOut]:
    """EventOut of rows from `events_after`, validated as one list (a model built per event costs three times
    as much, and a page holds up to a thousand)."""
    return _EVENTS_OUT.validate_python([
        {"id": e.seq, "created_at": e.created_at, "type": e.type, "level": e.level, "stage": e.stage,
         "message": e.message, "progress": e.progress, "data": e.data}
        for e in events
    ])


def _parse_last_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    # isascii: str.isdigit() also accepts other scripts' digits; the bound keeps the cursor in a 64-bit column.
    if not (value.strip().isascii() and value.strip().isdigit()) or int(value.strip()) > EVENT_CURSOR_MAX:
        raise InvalidRequest("Last-Event-ID must be the numeric id of an event already received",
                             errors=[FieldError(field="Last-Event-ID",
                                                message=f"expected an integer from 0 to {EVENT_CURSOR_MAX}")])
    return int(value.strip())


@router.get(
    "/events",
    response_model=EventList,
    summary="Job events: a page of JSON, or a live Server-Sent Events stream",
    description="With `Accept: text/event-stream` the response is an SSE stream: every event is sent as "
    "`id: <seq>` + `data: <EventOut JSON>`, the stream resumes after `Last-Event-ID` (or `after`), and "
    "it ends with an `event: end` message once the job is finished. Reconnecting to a finished job "
    "with nothing new answers 204, which tells EventSource clients to stop. Streams also close after "
    "`DRAFTSMITH_SSE_MAX_STREAM_SECONDS`; reconnect with Last-Event-ID to continue.",
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
               204: {"description": "Stream requested for a finished job with no newer events."},
               **problem_responses(401, 403, 404, 422)},
)
async def list_events(
    principal: ReadPrincipal,
    services: ServicesDep,
    request: Request,
    job_id: str,
    after: Annotated[int, Query(ge=0, le=EVENT_CURSOR_MAX, description="Return events with id > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> EventList | Response:
    # A hot read route: async, with its database work in one thread hop (api/deps.py run_read), since a thread
    # hop per query cost more than the query.
    streaming = "text/event-stream" in request.headers.get("accept", "")
    if not streaming and last_event_id is None:
        # Event ids are 32-bit in the database: no event is beyond that, so a larger cursor reads as that one.
        return await run_read(services, _events_page, principal.org_id, job_id, min(after, EVENT_ID_MAX), limit)
    return await run_read(services, _events_or_stream, principal.org_id, services, request, job_id, after, limit,
                          last_event_id, streaming)


def _events_page(db: Connection, org_id: str, job_id: str, after: int, limit: int) -> EventList:
    """A page of JSON: the job's state and its events in one query. A cursor beyond the job's latest event finds
    no events, so the page is empty (a poller keeps its cursor), as `_events_or_stream` answers it."""
    job, events = job_events_page(db, org_id, job_id, after, limit + 1)
    page = events[:limit]
    return EventList(data=_events_out(page), has_more=len(events) > limit,
                     next_cursor=page[-1].seq if page else None, job_status=job.status)


def _events_or_stream(db: Connection, org_id: str, services: Services, request: Request, job_id: str, after: int,
                      limit: int, last_event_id: str | None, streaming: bool) -> EventList | Response:
    job = job_state_for_org(db, org_id, job_id)
    resume_from = _parse_last_event_id(last_event_id)
    cursor = resume_from if resume_from is not None else after
    if cursor > job.event_seq:
        # Beyond the job's latest event: no id a client can have received. A page is just empty (a poller
        # keeps its cursor); a stream would wait for ids that never come (it would hang), so it is refused, naming
        # the cursor. (The query never sees such a value: event ids are 32-bit in the database.)
        if not streaming:
            return EventList(data=[], has_more=False, next_cursor=None, job_status=job.status)
        field = "Last-Event-ID" if resume_from is not None else "after"
        message = (f"{cursor} is beyond this job's latest event ({job.event_seq}); resume from an event id you "
                   "received, or 0 for the whole log")
        raise InvalidRequest(f"{field}: {message}", errors=[FieldError(field=field, message=message)])
    if streaming:
        if JobStatus(job.status) in TERMINAL_STATUSES and not events_after(db, job.id, cursor, 1):
            return Response(status_code=204)
        # The stream reads through the job's shared feed, with its own short sessions; this connection goes back
        # to the pool when this function returns.
        return StreamingResponse(
            _sse_stream(request, services, job.id, cursor, job.event_seq),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    events = events_after(db, job.id, cursor, limit + 1)
    page = events[:limit]
    return EventList(data=_events_out(page), has_more=len(events) > limit,
                     next_cursor=page[-1].seq if page else None, job_status=job.status)


def _poll(services: Services, job_id: str, after: int) -> tuple[str, list[EventOut]]:
    with read_sessions(services)() as session:
        # Status first, then events: the terminal transition commits together with its own event,
        # so a terminal status read here guarantees its event is visible to the query below.
        status = job_status(session, job_id) or JobStatus.CANCELLED
        return status, _events_out(events_after(session, job_id, after, SSE_BATCH))


def _event_feeds(request: Request, services: Services) -> EventFeeds:
    feeds = getattr(request.app.state, "event_feeds", None)
    if feeds is None:
        async def poll(job_id: str, after: int) -> tuple[str, list[EventOut]]:
            return await run_in_threadpool(_poll, services, job_id, after)

        feeds = request.app.state.event_feeds = EventFeeds(poll, services.settings.sse_poll_interval_seconds)
    return feeds


async def _sse_stream(request: Request, services: Services, job_id: str, after: int,
                      start_seq: int) -> AsyncIterator[str]:
    settings = services.settings
    deadline = time.monotonic() + settings.sse_max_stream_seconds
    last_write = time.monotonic()
    yield "retry: 2000\n\n"
    async with _event_feeds(request, services).subscribe(job_id, start_seq) as feed:
        while True:
            if feed.error is not None:
                return  # the feed's poll failed (database down): end; the client reconnects with Last-Event-ID
            if after + 1 < feed.window_start():
                # Further behind than the shared window: catch up with reads of our own.
                status, events = await run_in_threadpool(_poll, services, job_id, after)
                terminal = JobStatus(status) in TERMINAL_STATUSES and len(events) < SSE_BATCH
            else:
                events = [event for event in list(feed.window) if event.id > after]
                terminal = feed.terminal() and (events[-1].id if events else after) >= feed.last_seq
            for event in events:
                after = event.id
                yield f"id: {event.id}\ndata: {event.model_dump_json()}\n\n"
                last_write = time.monotonic()
            if terminal:
                status = feed.status if feed.terminal() else JobStatus(status)
                yield f"event: end\ndata: {json.dumps({'job_id': job_id, 'status': str(status)})}\n\n"
                return
            if len(events) == SSE_BATCH:
                continue  # more are waiting: drain before waiting
            if time.monotonic() > deadline or await request.is_disconnected():
                return
            if time.monotonic() - last_write > settings.sse_keepalive_seconds:
                yield ": keepalive\n\n"  # comment line: keeps proxies from closing an idle stream
                last_write = time.monotonic()
            if after + 1 >= feed.window_start():
                await feed.wait(settings.sse_poll_interval_seconds * 4)


@router.get(
    "/metrics",
    response_model=MetricsOut,
    summary="Training and validation metrics, downsampled to at most max_points per series",
    description="Series with more points than `max_points` in the step range are split into at most "
    "`max_points` equal step buckets; each bucket reports its mean value at its last step.",
    responses=problem_responses(401, 403, 404, 422),
)
async def get_metrics(
    principal: ReadPrincipal,
    services: ServicesDep,
    job_id: str,
    name: Annotated[list[str] | None, Query(description="Metric names; default all.", max_length=50)] = None,
    step_min: Annotated[int, Query(ge=0, le=2**62)] = 0,
    step_max: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    max_points: Annotated[int, Query(ge=2, le=10_000)] = 500,
) -> MetricsOut:
    # A hot read route: async, with its database work in one thread hop (api/deps.py run_read).
    return await run_read(services, _metrics, principal.org_id, job_id, name, step_min, step_max, max_points)


def _metrics(db: Connection, org_id: str, job_id: str, name: list[str] | None, step_min: int, step_max: int | None,
             max_points: int) -> MetricsOut:
    series = metric_series(db, org_id, job_id, name, step_min, step_max, max_points)
    return MetricsOut(job_id=job_id, max_points=max_points, series=[
        MetricSeries(name=one.name, points=_POINTS_OUT.validate_python(one.points), total_points=one.total_points,
                     downsampled=one.downsampled)
        for one in series])


_POINTS_OUT = TypeAdapter(list[MetricPointOut])


def _artifact_out(artifact: Artifact) -> ArtifactOut:
    return ArtifactOut(
        id=artifact.id, name=artifact.name, kind=artifact.kind, stage=artifact.stage, size_bytes=artifact.size_bytes,
        sha256=artifact.sha256, content_type=artifact.content_type, created_at=artifact.created_at,
        download_path=f"/v1/jobs/{artifact.job_id}/artifacts/{artifact.name}",
    )


@router.get("/artifacts", response_model=ArtifactList, summary="List a job's artifacts",
            responses=problem_responses(401, 403, 404))
def list_artifacts(principal: ReadPrincipal, session: SessionDep, job_id: str) -> ArtifactList:
    job = get_job_for_org(session, principal.org_id, job_id)
    return ArtifactList(data=[_artifact_out(a) for a in artifacts_of(session, job.id)])


_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def artifact_response(services: Services, artifact: Artifact, *, cache_control: str | None = None) -> Response:
    """An artifact's bytes: a redirect to a presigned URL when the storage makes one, else streamed from it."""
    filename = _UNSAFE_FILENAME_CHARS.sub("_", PurePosixPath(artifact.name).name) or "artifact"
    url = services.storage.presigned_url(artifact.storage_key, filename=filename)
    if url is not None:
        return RedirectResponse(url, status_code=307)
    if not services.storage.exists(artifact.storage_key):
        raise NotFound(f"artifact {artifact.name!r} is registered but its bytes are missing from storage")
    headers = {"Content-Length": str(artifact.size_bytes), "Content-Disposition": f'attachment; filename="{filename}"',
               "ETag": f'"{artifact.sha256}"'}
    if cache_control:
        headers["Cache-Control"] = cache_control
    return StreamingResponse(services.storage.open_chunks(artifact.storage_key), media_type=artifact.content_type,
                             headers=headers)


@router.get(
    "/artifacts/{name:path}",
    summary="Download an artifact",
    description="Local storage streams the bytes (ETag = sha256); S3 storage answers 307 with a presigned URL.",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
               307: {"description": "Redirect to a presigned object-storage URL."},
               **problem_responses(401, 403, 404)},
)
def download_artifact(principal: ReadPrincipal, session: SessionDep, services: ServicesDep, job_id: str,
                      name: str) -> Response:
    job = get_job_for_org(session, principal.org_id, job_id)
    artifact = artifact_named(session, job.id, name)
    if artifact is None:
        raise NotFound(f"job {job.id} has no artifact {name!r}")
    return artifact_response(services, artifact)
