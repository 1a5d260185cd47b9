"""Checks at the edge, before a route or the database sees a request.

- `refuse_control_characters` (an app-wide dependency, so it runs after routing and can name the
  parameter): path parameters and query values must not contain control characters. PostgreSQL cannot
  store NUL at all, and no id, cursor or filter of ours contains one, so this answers 422 naming the
  field instead of letting the value reach a query. `state_parameter_rules` writes the same rule into the
  OpenAPI document, so that a request valid by the document is not refused by it.
- `JsonBodyMiddleware`: a body sent to a `/v1` route must be `application/json` in UTF-8 (415 otherwise;
  uploads must be `multipart/form-data`), and must parse under `schemas.bounds.loads_json`'s limits
  (depth, 64-bit numbers, no NaN), else 422 naming `body`. Admission control (api/admission.py), outside
  this one, has already received the body whole, bounded in size and in time, so reading it here never
  waits on the client.
"""

from __future__ import annotations

import email.message
from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import send_problem
from domain.errors import FieldError, InvalidRequest
from schemas.bounds import NO_CONTROL_CHARACTERS_PATTERN, JsonInputError, find_control_character, loads_json

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MULTIPART_PATHS = frozenset({"/v1/files"})


async def refuse_control_characters(request: Request) -> None:
    errors = []
    for name, value in request.path_params.items():
        if isinstance(value, str) and (found := find_control_character(value)):
            errors.append(FieldError(field=name, message=f"must not contain control characters (found {found})"))
    for name, value in request.query_params.multi_items():
        if found := find_control_character(name) or find_control_character(value):
            field = name if not find_control_character(name) else ascii(name)
            errors.append(FieldError(field=field, message=f"must not contain control characters (found {found})"))
    if errors:
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors)


def state_parameter_rules(document: dict[str, Any]) -> None:
    """Give every string of a path or query parameter in the OpenAPI `document` the pattern that excludes control
    characters (`refuse_control_characters`'s rule), unless its route states a stricter pattern of its own (an id,
    a secret name, a month), which excludes them too. Enums and references are left as they are."""
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") in ("path", "query"):
                    _state_no_control_characters(parameter.get("schema", {}))


def _state_no_control_characters(schema: dict[str, Any], stated: str | None = None) -> None:
    """`stated`: the pattern a route gave an optional parameter, which FastAPI puts beside `anyOf` rather than on its
    string option; it is moved onto that option, where readers and request generators look for it."""
    if "enum" in schema or "const" in schema or "$ref" in schema:
        return
    pattern = schema.get("pattern") or stated
    if schema.get("type") == "string":
        schema["pattern"] = pattern or NO_CONTROL_CHARACTERS_PATTERN
    elif schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        schema.pop("pattern", None)  # a repeatable parameter's: each value's
        _state_no_control_characters(schema["items"], pattern)
    if "anyOf" in schema:
        schema.pop("pattern", None)
        for option in schema["anyOf"]:
            _state_no_control_characters(option, pattern)


def _media_type(content_type: str) -> tuple[str, str | None]:
    message = email.message.Message()
    message["content-type"] = content_type
    charset = message.get_param("charset")
    return message.get_content_type(), charset.lower() if isinstance(charset, str) else None


class JsonBodyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (declared is not None and declared.strip() not in (b"", b"0"))
        if not has_body:
            await self.app(scope, receive, send)
            return
        media_type, charset = _media_type(headers.get(b"content-type", b"").decode("latin-1"))
        multipart = scope["path"].rstrip("/") in MULTIPART_PATHS
        if multipart and media_type != "multipart/form-data":
            await _problem(send, scope, 415, "unsupported-media-type", "Unsupported Media Type",
                           "upload the file as multipart/form-data (a `file` part)")
            return
        if multipart:
            await self.app(scope, receive, send)
            return
        if media_type != "application/json" or charset not in (None, "utf-8", "utf8"):
            got = media_type or "no Content-Type"
            await _problem(send, scope, 415, "unsupported-media-type", "Unsupported Media Type",
                           f"send the body as application/json in UTF-8 (got {got}"
                           f"{'; charset=' + charset if charset else ''})")
            return
        chunks: list[bytes] = []
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break  # the client went away; nothing to answer
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except HTTPException as exc:  # the size limit, raised while the body streamed in
            await _problem(send, scope, exc.status_code, "payload-too-large", "Upload too large", str(exc.detail))
            return
        body = b"".join(chunks)
        if body:
            try:
                loads_json(body)
            except JsonInputError as exc:
                await _problem(send, scope, 422, InvalidRequest.slug, InvalidRequest.title,
                               f"body: {exc}", errors=[{"field": "body", "message": str(exc)}])
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)


async def _problem(send: Send, scope: Scope, status: int, slug: str, title: str, detail: str,
                   errors: list[dict[str, str]] | None = None) -> None:
    await send_problem(scope, send, status, slug, title, detail, errors=errors)
