"""Typed FastAPI dependencies: services, database session, and the authenticated principal.

Services (engine, queue, storage) are built on first use rather than at import, so importing
`api.main` reads no settings and opens no connection; the same app object then serves under
uvicorn, TestClient or schemathesis' ASGI transport, with or without a lifespan run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.auth import Principal, authenticate
from api.db import create_db_engine, create_session_factory
from api.queue import CeleryQueue, RecordingQueue, queue_from_settings
from api.settings import Settings, load_settings
from api.storage import LocalStorage, S3Storage, storage_from_settings


@dataclass
class Services:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    queue: RecordingQueue | CeleryQueue
    storage: LocalStorage | S3Storage

    @classmethod
    def from_settings(cls, settings: Settings) -> Services:
        engine = create_db_engine(settings.database_url, echo=settings.database_echo)
        return cls(
            settings=settings,
            engine=engine,
            session_factory=create_session_factory(engine),
            queue=queue_from_settings(settings),
            storage=storage_from_settings(settings),
        )

    def close(self) -> None:
        self.engine.dispose()


_services_lock = threading.Lock()


def services_for(app: FastAPI) -> Services:
    services: Services | None = getattr(app.state, "services", None)
    if services is None:
        with _services_lock:
            services = getattr(app.state, "services", None)
            if services is None:
                settings = getattr(app.state, "settings", None) or load_settings()
                services = Services.from_settings(settings)
                app.state.services = services
    return services


def get_services(request: Request) -> Services:
    return services_for(request.app)


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> Settings:
    return services.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    session = services.session_factory()
    try:
        yield session
    finally:
        session.rollback()  # anything the route did not commit is discarded
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]

# Declares the bearer scheme in OpenAPI; the header itself is checked by `authenticate`
# so that every failure gets a problem+json body that says what to fix.
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer dsk_...`")


def get_principal(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return authenticate(session, settings, request.headers.get("authorization"))


def _require(scope: str):  # noqa: ANN202 - returns a dependency callable
    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(scope)
        return principal

    dependency.__name__ = f"require_{scope}"
    return dependency


ReadPrincipal = Annotated[Principal, Depends(_require("read"))]
WritePrincipal = Annotated[Principal, Depends(_require("write"))]
AdminPrincipal = Annotated[Principal, Depends(_require("admin"))]
