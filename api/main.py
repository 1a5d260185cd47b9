"""The ASGI app: `api.main:app` (uvicorn api.main:app), or `create_app(settings)` in tests.

Importing this module builds routes only: settings are read, and the database engine, broker
client and storage are created, on first use (or at startup under a server). The database schema
is never touched here; run `draftsmith db upgrade` first.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import logging
import typing
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.admission import AdmissionCollector, AdmissionControlMiddleware, AdmissionState, configure_thread_limiter
from api.dashboard import router as dashboard_router
from api.deps import services_for
from api.edge import JsonBodyMiddleware, refuse_control_characters, state_parameter_rules
from api.observability import (
    PUBLISH_INTERVAL_SECONDS,
    ApiMetrics,
    BodySizeLimitMiddleware,
    ProcessBoard,
    RequestMetricsMiddleware,
)
from api.problems import PROBLEM_MEDIA_TYPE, UnhandledErrorMiddleware, install_problem_handlers
from api.routes import audits, drafters, files, health, job_data, jobs, secrets, usage, webhooks
from domain.deliveries import dispatch_due_webhooks
from domain.redaction import install_log_redaction, register_secret_values, secret_setting_values
from domain.settings import Settings

log = logging.getLogger("draftsmith.api")


def _version() -> str:
    """The installed distribution's version (pyproject's `version`), from its metadata: the API does not import the
    `draftsmith` command's package for it (tests/test_layout.py)."""
    try:
        return importlib.metadata.version("draftsmith")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
API_ROUTERS = (jobs.router, job_data.router, files.router, webhooks.router, secrets.router, audits.router,
               drafters.router, usage.router, health.router)
"""The routers of the OpenAPI document (the dashboard's is included apart, outside the document)."""
JSON_BODY_LIMIT = 1 << 20  # a job spec is a few KB; 1 MiB leaves room and stops abuse
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers around an upload

DESCRIPTION = """\
Train DFlash 2 speculative-decoding drafters for your own fine-tuned models.

Authenticate with `Authorization: Bearer dsk_...`. Errors are `application/problem+json`
(RFC 9457) with `type`, `title`, `status`, `detail`, `instance`, and for validation errors an
`errors` list naming each field (and line, for uploaded files).
"""


async def _webhook_loop(app: FastAPI) -> None:
    services = services_for(app)
    interval = services.settings.webhook_dispatch_interval_seconds
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(dispatch_due_webhooks, services.session_factory, services.settings)
        except Exception:  # keep the loop alive; the next tick retries
            log.exception("webhook dispatch failed")


async def _publish_loop(app: FastAPI) -> None:
    """This process's capacity counters on the server's ProcessBoard, every few seconds: /readyz answered by any
    worker process lists every process's (api/observability.py)."""
    while True:
        app.state.process_board.publish(app.state.admission.report())
        await asyncio.sleep(PUBLISH_INTERVAL_SECONDS)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    services = services_for(app)  # fail fast at startup on bad settings
    configure_thread_limiter(services.settings)
    register_secret_values(*secret_setting_values(services.settings))
    tasks = []
    if services.settings.webhook_dispatch_interval_seconds > 0:
        tasks.append(asyncio.create_task(_webhook_loop(app)))
    if app.state.process_board.directory is not None:
        tasks.append(asyncio.create_task(_publish_loop(app)))
    # Everything loaded so far (modules, the app, settings) lives as long as the process: out of the collector's
    # sight, a full collection walks only what requests create, so it no longer lands as a long pause in a
    # request's latency (bench/load_api.py's p99 at 100 clients).
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        services.close()


def _document_problems(app: FastAPI, routers: Sequence[APIRouter]) -> None:
    """Make the OpenAPI document say what the handlers do: every error body is problem+json, and every body
    `routers` parse by hand is in its components.

    FastAPI lists a response `model` under application/json and adds its own 422 schema
    (HTTPValidationError); both are replaced by the Problem schema under application/problem+json.
    """
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        problem = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if PROBLEM_MEDIA_TYPE in content or status == "422":
                        response["content"] = dict(problem)
                        if status == "422":
                            response["description"] = "Validation failed; `errors` names each field"
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        _document_hand_parsed_bodies(schema, routers)
        state_parameter_rules(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


SCHEMA_REF = "#/components/schemas/"


def schema_refs(node: object) -> Iterator[str]:
    """Every `$ref` in an OpenAPI document (or a part of one)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from schema_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from schema_refs(value)


def hand_parsed_body_models(routers: Sequence[APIRouter]) -> dict[str, type[BaseModel]]:
    """The models of the bodies that routes parse themselves, by name: a route whose body needs this deployment's
    settings as validation context (the job and audit specs) reads it in a dependency returning the model, and
    describes it with `openapi_extra`, so FastAPI never sees the model as a body."""
    models: dict[str, type[BaseModel]] = {}
    for route in (route for router in routers for route in router.routes):
        if not isinstance(route, APIRoute) or "requestBody" not in (route.openapi_extra or {}):
            continue
        for dependency in route.dependant.dependencies:
            try:
                returned = typing.get_type_hints(dependency.call).get("return")
            except (NameError, TypeError, AttributeError):  # annotations that do not resolve name no body
                continue
            if isinstance(returned, type) and issubclass(returned, BaseModel):
                models[returned.__name__] = returned
    return models


def _document_hand_parsed_bodies(schema: dict, routers: Sequence[APIRouter]) -> None:
    """Put the schema of every hand-parsed body into the document's components. FastAPI lists only the models
    it validates itself, so a body described by `openapi_extra` resolved only when a response happened to
    carry the same model (JobSpec, inside Job); AuditSpec did not, and its `$ref` pointed nowhere: client
    generators failed and schemathesis could not build an audit body."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    missing = {ref.removeprefix(SCHEMA_REF) for ref in schema_refs(schema.get("paths", {}))
               if ref.startswith(SCHEMA_REF)} - set(components)
    for name, model in sorted(hand_parsed_body_models(routers).items()):
        if name not in missing:
            continue
        generated = model.model_json_schema(ref_template=SCHEMA_REF + "{model}", mode="validation")
        for nested, definition in generated.pop("$defs", {}).items():
            components.setdefault(nested, definition)
        components[name] = generated


def _serve_docs_locally(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from the vendored copies the dashboard serves (api/dashboard/static/
    VENDORED.md), not FastAPI's CDN defaults: an offline deployment gets working pages, and no page of ours
    loads third-party code."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html

    assert app.openapi_url is not None
    title = app.title

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{title} - Swagger UI",
                                   swagger_js_url="/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/assets/swagger-ui.css", swagger_favicon_url="/assets/favicon.svg",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_ui_parameters={"validatorUrl": None})  # no call to validator.swagger.io

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url="/assets/redoc.standalone.js", redoc_favicon_url="/assets/favicon.svg",
                              with_google_fonts=False)


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(
        title="Draftsmith API",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by _serve_docs_locally
        redoc_url=None,
        dependencies=[Depends(refuse_control_characters)],
        # One schema per model: JobSpec is both the request body and part of the Job response.
        separate_input_output_schemas=False,
        openapi_tags=[
            {"name": "jobs", "description": "Create and control drafter-training jobs."},
            {"name": "job data", "description": "Events (SSE), metrics and artifacts of a job."},
            {"name": "files", "description": "Uploaded prompt files."},
            {"name": "webhooks", "description": "Signed notifications of job state changes (admin)."},
            {"name": "secrets", "description": "Publishing credentials, stored encrypted, referenced by name (admin)."},
            {"name": "audits", "description": "Drift audits: an existing drafter against a new target checkpoint."},
            {"name": "drafters", "description": "Published drafters with their lineage and metrics."},
            {"name": "usage", "description": "Compute and tokens used this month, and the organisation's quotas."},
            {"name": "health", "description": "Liveness, readiness and Prometheus metrics."},
        ],
    )
    if settings is not None:
        app.state.settings = settings
    install_log_redaction()  # access-log query keys, Authorization values, dsk_/whsec_ secrets
    install_problem_handlers(app)

    def body_limit(path: str) -> int:
        if path.rstrip("/") == "/v1/files":
            return services_for(app).settings.max_upload_bytes + MULTIPART_OVERHEAD
        return JSON_BODY_LIMIT

    app.state.metrics = ApiMetrics(lambda: services_for(app))
    app.state.admission = AdmissionState()
    app.state.process_board = ProcessBoard.from_environment()  # set by `draftsmith api` for its worker processes
    app.state.metrics.registry.register(AdmissionCollector(app.state.admission))
    # Outermost last. Admission checks the key, then receives the body whole (within the size limit and the
    # body deadline), then waits for a slot: a client trickling its body in, or without a key, holds no slot.
    app.add_middleware(UnhandledErrorMiddleware)  # innermost: a 500 answered here keeps the connection
    app.add_middleware(JsonBodyMiddleware)  # media type and JSON bounds of the body admission has received
    app.add_middleware(AdmissionControlMiddleware, services_getter=lambda: services_for(app),
                       state=app.state.admission)
    app.add_middleware(BodySizeLimitMiddleware, limit_for=body_limit)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    for router in API_ROUTERS:
        app.include_router(router)
    app.include_router(dashboard_router)  # the web dashboard at / (not part of the OpenAPI document)
    _serve_docs_locally(app)
    _document_problems(app, API_ROUTERS)
    return app


app = create_app()
