"""Errors as RFC 9457 problem details (`application/problem+json`).

Domain code raises `domain.errors` refusals (plain exceptions, raised by the worker and the CLI too); this
module gives each its HTTP status (`HTTP_STATUS`) and turns it, the HTTP-only refusals below, FastAPI's
validation errors and any unexpected exception into one shape:
`{type, title, status, detail, instance, errors?}` where `errors` names each offending field.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.exc import DataError, InterfaceError, InternalError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm.exc import StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from domain.errors import (
    Conflict,
    DomainError,
    FieldError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    ServiceUnavailable,
    TooManyActiveJobs,
    field_errors_from_pydantic,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:draftsmith:problem:"
DATABASE_RETRY_AFTER_SECONDS = 2
log = logging.getLogger("draftsmith.api")


class Problem(BaseModel):
    """The body of every error response."""

    type: str = Field(examples=["urn:draftsmith:problem:validation-error"])
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request path that failed.")
    errors: list[FieldError] | None = None


class Unauthenticated(DomainError):
    """No key, or a key that is unknown, revoked or expired (only HTTP requests carry keys)."""

    slug, title = "unauthenticated", "Missing or invalid API key"


class Forbidden(DomainError):
    slug, title = "forbidden", "Insufficient scope"


class PayloadTooLarge(DomainError):
    slug, title = "payload-too-large", "Upload too large"


HTTP_STATUS: dict[type[DomainError], int] = {
    DomainError: 400,
    InvalidRequest: 422,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,  # and its kinds: invalid transition, reused idempotency key, stage conflict/busy, pending cancel
    PayloadTooLarge: 413,
    TooManyActiveJobs: 429,
    QuotaExceeded: 429,
    ServiceUnavailable: 503,
}
"""The status each kind of refusal answers with; a subclass answers as its nearest listed base."""


def problem_status(exc: DomainError) -> int:
    return next(HTTP_STATUS[kind] for kind in type(exc).__mro__ if kind in HTTP_STATUS)


def problem_headers(exc: DomainError) -> dict[str, str]:
    headers = {"WWW-Authenticate": 'Bearer realm="draftsmith"'} if isinstance(exc, Unauthenticated) else {}
    if exc.retry_after_seconds is not None:
        headers["Retry-After"] = str(exc.retry_after_seconds)
    return headers


async def send_problem(scope: Scope, send: Send, status: int, slug: str, title: str, detail: str, *,
                       headers: dict[str, str] | None = None, errors: list[dict[str, str]] | None = None) -> None:
    """Answer with a problem body straight from ASGI middleware (before routing: no Request, no handlers)."""
    problem: dict[str, Any] = {"type": PROBLEM_TYPE_BASE + slug, "title": title, "status": status, "detail": detail,
                               "instance": scope["path"]}
    if errors:
        problem["errors"] = errors
    body = json.dumps(problem).encode()
    raw_headers = [(b"content-type", PROBLEM_MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    raw_headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def problem_response(
    request: Request,
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if errors is not None:
        body["errors"] = [e.model_dump(exclude_none=True) for e in errors]
    body.update(extra or {})
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _summary(errors: list[FieldError]) -> str:
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{first.field}: {first.message}{more}"


def install_problem_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DomainError)
        return problem_response(
            request, problem_status(exc), exc.slug, exc.title, exc.detail,
            errors=exc.errors, headers=problem_headers(exc), extra=exc.extra,
        )

    async def on_request_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = field_errors_from_pydantic(list(exc.errors()), drop_prefix=("body", "query", "path", "header"))
        return problem_response(
            request, 422, InvalidRequest.slug, InvalidRequest.title, _summary(errors) if errors else "invalid request",
            errors=errors,
        )

    async def on_pydantic_validation(request: Request, exc: Exception) -> JSONResponse:
        # A ValidationError escaping a route means we built a bad object: that is our bug, not the client's.
        log.exception("unexpected validation error", exc_info=exc)
        return problem_response(request, 500, "internal-error", "Internal server error", "unexpected validation error")

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        slug = {404: "not-found", 405: "method-not-allowed", 413: "payload-too-large", 415: "unsupported-media-type"}
        headers, detail = getattr(exc, "headers", None), str(exc.detail)
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            detail = f"{request.method} is not allowed on {request.url.path}; use {' or '.join(allowed)}"
        return problem_response(
            request, exc.status_code, slug.get(exc.status_code, f"http-{exc.status_code}"),
            title=_reason(exc.status_code), detail=detail, headers=headers,
        )

    async def on_stale(request: Request, exc: Exception) -> JSONResponse:
        # Optimistic locking caught a concurrent change to the same job (API and worker raced).
        return problem_response(request, 409, "concurrent-update", "Concurrent update",
                                "the job changed while this request was being handled; retry the request")

    async def on_database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # No connection within the pool timeout, or the database is down: a temporary condition, said as one.
        # (Engines hide bound parameters, so the message carries no values.)
        if not _database_unavailable(exc):
            return await on_unexpected(request, exc)  # e.g. SQLite's "no such table": a deployment fault
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, type(exc).__name__)
        return problem_response(
            request, 503, ServiceUnavailable.slug, ServiceUnavailable.title,
            "the database is busy or unavailable; retry shortly",
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )

    async def on_data_error(request: Request, exc: Exception) -> JSONResponse:
        # A backstop: the schemas bound every value to what the columns hold, so reaching this is a gap in
        # them (logged), but still the client's value, not a server fault.
        # Only the class and SQLSTATE: a driver's message may quote the refused value.
        orig = getattr(exc, "orig", exc)
        log.warning("database refused a value on %s %s: %s (sqlstate %s)", request.method, request.url.path,
                    type(orig).__name__, getattr(orig, "sqlstate", None))
        return problem_response(
            request, 422, InvalidRequest.slug, InvalidRequest.title,
            "a value is out of range or contains characters that cannot be stored",
            errors=[FieldError(field="body", message="a value is out of range or contains control characters")],
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error_response(request, exc)

    app.add_exception_handler(DomainError, on_problem)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(ValidationError, on_pydantic_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(StaleDataError, on_stale)
    for unavailable in (PoolTimeoutError, OperationalError, InterfaceError, InternalError):
        app.add_exception_handler(unavailable, on_database_unavailable)
    app.add_exception_handler(DataError, on_data_error)
    app.add_exception_handler(Exception, on_unexpected)


def internal_error_response(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        request, 500, "internal-error", "Internal server error", "an unexpected error occurred; it has been logged"
    )


class UnhandledErrorMiddleware:
    """Answers an unexpected exception with the 500 problem and keeps the connection.

    Starlette's outermost error middleware re-raises after answering, and uvicorn then closes the
    connection (a keep-alive client sees a reset). Installed innermost, this one answers and stops there.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # too late to answer: the server drops the connection
                raise
            await internal_error_response(Request(scope), exc)(scope, receive, send)


IDLE_IN_TRANSACTION_TIMEOUT = "25P03"  # SQLSTATE idle_in_transaction_session_timeout


def _database_unavailable(exc: Exception) -> bool:
    """True for a temporary condition: no pooled connection in time, the server unreachable or shutting down,
    SQLite's write lock held too long. SQLite reports schema faults as OperationalError too; those are not."""
    if isinstance(exc, PoolTimeoutError):
        return True
    orig = getattr(exc, "orig", None)
    if isinstance(exc, InternalError):
        # PostgreSQL closed a connection left idle in a transaction (DRAFTSMITH_DATABASE_IDLE_IN_TRANSACTION_
        # TIMEOUT_SECONDS): the request that kept it may be retried. Any other InternalError is a fault.
        return getattr(orig, "sqlstate", None) == IDLE_IN_TRANSACTION_TIMEOUT
    if isinstance(orig, sqlite3.Error):
        return any(word in str(orig) for word in ("locked", "busy", "unable to open"))
    return True


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves at this path. Starlette answers a 405 from the first route
    whose path matched, so its `Allow` names only that route's methods: /v1/jobs said `POST` alone although
    GET serves it too (RFC 9110 15.5.6 asks for all of them). So ask the router, method by method, through
    the public `matches` (FastAPI groups included routers in objects of its own, without `methods`)."""
    allowed = []
    for method in HTTP_METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries declaring problem+json bodies for the given status codes."""
    descriptions = {
        400: "Malformed request", 401: "Missing or invalid API key", 403: "Key lacks the required scope",
        404: "Not found (or owned by another organisation)", 409: "Conflicts with the current state",
        413: "Upload larger than the limit", 422: "Validation failed; `errors` names each field",
        429: "Organisation concurrency limit reached", 503: "A dependency is unavailable",
    }
    return {
        status: {
            "description": descriptions.get(status, "Error"),
            "model": Problem,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
