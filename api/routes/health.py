"""/healthz (process alive), /readyz (database reachable and migrated, broker reachable, no request stalled; this
process's capacity: slots in use, requests waiting, worker threads and database connections in use, refusals, slow
clients; and every API process's, api/observability.py ProcessBoard), /metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import services_for
from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE, problem_responses
from api.schemas import CapacityOut, HealthOut, ProcessesOut, ReadinessOut
from domain.db import ping as ping_database
from domain.redaction import redact_text
from migrations.revisions import check_schema_is_current

router = APIRouter(tags=["health"])
CHECK_TIMEOUT_SECONDS = 5.0


@router.get("/healthz", response_model=HealthOut, summary="Liveness: the process answers")
def healthz() -> HealthOut:
    return HealthOut(status="ok")


_check_threads: anyio.CapacityLimiter | None = None


async def _check(name: str, func: Any) -> tuple[str, str]:
    # Threads of their own: readiness answers while every worker thread is busy (it reports saturation).
    global _check_threads
    if _check_threads is None:
        _check_threads = anyio.CapacityLimiter(3)
    try:
        await asyncio.wait_for(anyio.to_thread.run_sync(func, limiter=_check_threads), timeout=CHECK_TIMEOUT_SECONDS)
    except TimeoutError:
        return name, f"timeout after {CHECK_TIMEOUT_SECONDS:g}s"
    except Exception as exc:  # any failure means "not ready"; say which and why
        return name, f"error: {type(exc).__name__}: {redact_text(str(exc))[:200]}"  # no URL passwords
    return name, "ok"


@router.get(
    "/readyz",
    response_model=ReadinessOut,
    summary="Readiness: database reachable and migrated, broker reachable, no request stalled",
    responses={503: {**problem_responses(503)[503], "description": "A dependency is down, or requests are stalled "
                     "(`checks.requests`); `checks` says which."}},
)
async def readyz(request: Request) -> Any:
    services = services_for(request.app)
    database = _check("database", lambda: ping_database(services.engine))
    schema = _check("schema", lambda: check_schema_is_current(services.engine))
    broker = (
        _check("broker", services.queue.ping)
        if services.settings.broker_enabled
        else asyncio.sleep(0, result=("broker", "disabled"))
    )
    checks = dict(await asyncio.gather(database, schema, broker))
    admission = getattr(request.app.state, "admission", None)
    if admission is not None and admission.database is None:
        admission.watch(services)  # before any request was admitted: the pool and the stall threshold
    capacity = CapacityOut.model_validate(admission.report()) if admission is not None else None
    if capacity is not None and capacity.stalled:
        # A process whose requests wait on a lock or a connection answers nothing else in time either: out of the
        # load balancer's rotation until they are through (the database's statement and idle-in-transaction
        # timeouts bound the wait).
        checks["requests"] = (f"stalled: {capacity.stalled} in progress for more than "
                              f"{services.settings.api_stalled_request_seconds:g} s (the oldest "
                              f"{capacity.oldest_in_progress_seconds:.0f} s)")
    board = getattr(request.app.state, "process_board", None)
    processes = (ProcessesOut.model_validate(board.report(capacity.model_dump()))
                 if board is not None and capacity is not None else None)
    if all(value in ("ok", "disabled") for value in checks.values()):
        return ReadinessOut(status="ready", checks=checks, capacity=capacity, processes=processes)
    failing = ", ".join(f"{name} ({value})" for name, value in checks.items() if value not in ("ok", "disabled"))
    return JSONResponse(
        {"type": PROBLEM_TYPE_BASE + "not-ready", "title": "Not ready", "status": 503,
         "detail": f"not ready: {failing}", "instance": request.url.path, "checks": checks,
         "capacity": capacity.model_dump() if capacity else None,
         "processes": processes.model_dump() if processes else None},
        status_code=503, media_type=PROBLEM_MEDIA_TYPE,
    )


@router.get("/metrics", summary="Prometheus metrics (text exposition format)", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
