"""Errors as RFC 9457 problem details (`application/problem+json`).

Domain code raises `ProblemError` subclasses (plain exceptions, usable from the worker too); the
handlers here turn them, FastAPI's validation errors and any unexpected exception into one shape:
`{type, title, status, detail, instance, errors?}` where `errors` names each offending field.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.orm.exc import StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:draftsmith:problem:"
log = logging.getLogger("draftsmith.api")


class FieldError(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. `drafter.block_size`, or `file`.")
    message: str
    line: int | None = Field(default=None, description="1-based line number, for errors inside an uploaded file.")


class Problem(BaseModel):
    """The body of every error response."""

    type: str = Field(examples=["urn:draftsmith:problem:validation-error"])
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request path that failed.")
    errors: list[FieldError] | None = None


class ProblemError(Exception):
    status = 400
    slug = "bad-request"
    title = "Bad request"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra or {}


class InvalidRequest(ProblemError):
    status, slug, title = 422, "validation-error", "Request validation failed"


class Unauthenticated(ProblemError):
    status, slug, title = 401, "unauthenticated", "Missing or invalid API key"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="draftsmith"'})


class Forbidden(ProblemError):
    status, slug, title = 403, "forbidden", "Insufficient scope"


class NotFound(ProblemError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(ProblemError):
    status, slug, title = 409, "conflict", "Conflict"


class InvalidTransition(Conflict):
    slug, title = "invalid-transition", "Job state does not allow this"


class IdempotencyConflict(Conflict):
    slug, title = "idempotency-key-reused", "Idempotency-Key reused with a different body"


class TooManyActiveJobs(ProblemError):
    status, slug, title = 429, "concurrency-limit", "Too many active jobs"


class PayloadTooLarge(ProblemError):
    status, slug, title = 413, "payload-too-large", "Upload too large"


class ServiceUnavailable(ProblemError):
    status, slug, title = 503, "service-unavailable", "Service unavailable"


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


def field_errors_from_pydantic(errors: list[Any], *, drop_prefix: tuple[str, ...] = ()) -> list[FieldError]:
    """Pydantic error dicts -> FieldError, with `body`/`query` prefixes removed from the path."""
    result = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        while loc and loc[0] in drop_prefix:
            loc = loc[1:]
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        result.append(FieldError(field=".".join(loc) or "body", message=message))
    return result


def _summary(errors: list[FieldError]) -> str:
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{first.field}: {first.message}{more}"


def install_problem_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(
            request, exc.status, exc.slug, exc.title, exc.detail,
            errors=exc.errors, headers=exc.headers, extra=exc.extra,
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
        return problem_response(
            request, exc.status_code, slug.get(exc.status_code, f"http-{exc.status_code}"),
            title=_reason(exc.status_code), detail=str(exc.detail), headers=getattr(exc, "headers", None),
        )

    async def on_stale(request: Request, exc: Exception) -> JSONResponse:
        # Optimistic locking caught a concurrent change to the same job (API and worker raced).
        return problem_response(request, 409, "concurrent-update", "Concurrent update",
                                "the job changed while this request was being handled; retry the request")

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(
            request, 500, "internal-error", "Internal server error", "an unexpected error occurred; it has been logged"
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(ValidationError, on_pydantic_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(StaleDataError, on_stale)
    app.add_exception_handler(Exception, on_unexpected)


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
