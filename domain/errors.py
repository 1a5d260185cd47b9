"""The domain's refusals: plain exceptions the API, the worker and the CLI raise and catch alike.

Each kind has a stable `slug` (the last word of its problem type, `urn:draftsmith:problem:<slug>`) and a
`title`. Which HTTP status a kind answers with is the HTTP layer's business (`api/problems.py` maps every
class here), not the domain's. `detail` is the sentence a user reads; `errors` names each offending field
and its fix; `extra` adds members to the problem body (a job id, a limit) so that a client can act
without parsing the sentence; `retry_after_seconds` is set when trying again later can succeed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class FieldError(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. `drafter.block_size`, or `file`.")
    message: str
    line: int | None = Field(default=None, description="1-based line number, for errors inside an uploaded file.")


class DomainError(Exception):
    slug = "bad-request"
    title = "Bad request"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        retry_after_seconds: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.retry_after_seconds = retry_after_seconds
        self.extra = extra or {}


class InvalidRequest(DomainError):
    slug, title = "validation-error", "Request validation failed"


class NotFound(DomainError):
    slug, title = "not-found", "Not found"


class Conflict(DomainError):
    slug, title = "conflict", "Conflict"


class InvalidTransition(Conflict):
    slug, title = "invalid-transition", "Job state does not allow this"


class IdempotencyConflict(Conflict):
    slug, title = "idempotency-key-reused", "Idempotency-Key reused with a different body"


class StageConflict(Conflict):
    slug, title = "stage-conflict", "Stage out of order"


class CancellationPending(Conflict):
    slug, title = "cancellation-pending", "Cancellation requested"


class StageBusy(Conflict):
    slug, title = "stage-busy", "Another worker is running this stage"


class TooManyActiveJobs(DomainError):
    slug, title = "concurrency-limit", "Too many active jobs"


class QuotaExceeded(DomainError):
    slug, title = "quota-exceeded", "Monthly quota exceeded"


class ServiceUnavailable(DomainError):
    slug, title = "service-unavailable", "Service unavailable"


def field_errors_from_pydantic(errors: list[Any], *, drop_prefix: tuple[str, ...] = (),
                               model: type[BaseModel] | None = None) -> list[FieldError]:
    """Pydantic error dicts -> FieldError, with `body`/`query` prefixes removed from the path. With `model`, a
    missing field's bare "Field required" becomes what to set there and an example (`missing_message`)."""
    result = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        while loc and loc[0] in drop_prefix:
            loc = loc[1:]
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if model is not None and error.get("type") == "missing":
            message = missing_message(model, loc) or message
        result.append(FieldError(field=".".join(loc) or "body", message=message))
    return result


def missing_message(model: type[BaseModel], loc: list[str]) -> str | None:
    """"required: set target.uri (where the target lives: ...), e.g. ..." for a field missing from a `model` body.
    Pydantic says only "Field required", which names neither what to put there nor how it looks; a missing
    object is explained by the fields inside it that have no default. None when `loc` is not a model field."""
    current: Any = model
    info = None
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        info = current.model_fields[part]
        current = info.annotation
    if info is None:
        return None
    path = ".".join(loc)
    if isinstance(current, type) and issubclass(current, BaseModel):
        leaves = [(f"{path}.{name}", child) for name, child in current.model_fields.items() if child.is_required()]
    else:
        leaves = [(path, info)]
    parts = []
    for name, field in leaves:
        text = name
        if field.description:
            what = field.description.split(". ")[0].rstrip(".")
            text += f" ({what[:1].lower()}{what[1:]})"
        if field.examples:
            text += ", e.g. " + " or ".join(str(example) for example in field.examples)
        parts.append(text)
    return ("required: set " + "; ".join(parts)) if parts else None
