"""Typed FastAPI dependencies: services, database session, and the authenticated principal.

Services (engine, queue, storage) are built on first use rather than at import, so importing
`api.main` reads no settings and opens no connection; the same app object then serves under
uvicorn, TestClient or schemathesis' ASGI transport, with or without a lifespan run.

Database sessions hold a connection only while a thread works on the request: authentication uses a
session of its own, closed before the body is read; the route's session closes when the route function
returns, before the response is sent. Authentication, GET routes and SSE polls only read, so their
sessions are in autocommit mode: no BEGIN/ROLLBACK round trips (each statement sees the latest commit,
as in PostgreSQL's READ COMMITTED transactions anyway). Connections in use therefore never outnumber the worker threads (plus teardowns in progress),
and the pool is sized from the same setting (`pool_limits`), so no thread ever waits for a connection
that a request waiting for a thread is holding (the deadlock behind "QueuePool limit reached" under
load). Cheap dependencies are `async def`: no thread hop for them.

A sync route's session ends later than its function: FastAPI validates the route's return value on another worker
thread first, and only then runs the session's teardown. A transaction still open when the route returns therefore
waits for a free thread while holding its locks; when the threads are all taken by requests waiting for those very
locks, nothing moves again (concurrent cancels of one job hung a process that way). Routes that lock rows run their
work through `run_write` instead: one thread hop whose session ends on that thread, before the answer is validated.
PostgreSQL's idle-in-transaction timeout (domain/db.py SessionTimeouts) ends any transaction left behind anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from api.admission import PRINCIPAL_STATE_KEY
from api.auth import Principal, authenticate
from domain.db import PoolLimits, SessionTimeouts, create_db_engine, create_session_factory
from domain.queue import CeleryQueue, RecordingQueue, queue_from_settings
from domain.settings import Settings, load_settings
from domain.storage import LocalStorage, S3Storage, storage_from_settings

T = TypeVar("T")
log = logging.getLogger("draftsmith.api")


@dataclass
class Services:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    queue: RecordingQueue | CeleryQueue
    storage: LocalStorage | S3Storage
    # Autocommit sessions for reads: authentication (a key lookup, at most a one-row update), GET routes and
    # SSE polls. Round trips are what a request costs here.
    read_session_factory: sessionmaker[Session] | None = None
    # The same autocommit engine, for the hot read routes that use a plain Connection (`run_read`).
    read_engine: Engine | None = None
    # The driver connections checked out of the pool right now: what `close` interrupts.
    in_use: set[Any] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Services:
        engine = create_db_engine(settings.database_url, echo=settings.database_echo, limits=pool_limits(settings),
                                  timeouts=SessionTimeouts.for_api(settings))
        read_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        return cls(
            settings=settings,
            engine=engine,
            session_factory=create_session_factory(engine),
            read_session_factory=create_session_factory(read_engine),
            read_engine=read_engine,
            queue=queue_from_settings(settings),
            storage=storage_from_settings(settings),
            in_use=track_checkouts(engine),
        )

    def close(self) -> None:
        """At shutdown, after the server stopped waiting for requests in progress: interrupt the statements they
        still run, then close the pool. Without that, a statement waiting for a lock goes on waiting in the database
        after the process is gone, in the lock's queue ahead of live requests, until the statement timeout."""
        for connection in (self.in_use or set()).copy():
            interrupt_statement(connection)
        self.engine.dispose()


def track_checkouts(engine: Engine) -> set[Any]:
    """The driver connections of `engine` that are checked out, kept current by pool events (an invalidated
    connection is checked in as None, so it leaves the set when it is invalidated)."""
    in_use: set[Any] = set()
    event.listen(engine, "checkout", lambda connection, _record, _proxy: in_use.add(connection))
    event.listen(engine, "checkin", lambda connection, _record: in_use.discard(connection))
    event.listen(engine, "invalidate", lambda connection, _record, _error: in_use.discard(connection))
    return in_use


def interrupt_statement(connection: Any) -> None:
    """Ask the server to cancel what `connection` runs (psycopg: a cancel request on a connection of its own;
    sqlite3: interrupt). Never raises: it is done at shutdown, to connections that may be gone already."""
    # cancel_safe: psycopg's cancel that gives up after its timeout (a server that does not answer must not hold
    # the shutdown either).
    for name, kwargs in (("cancel_safe", {"timeout": 2.0}), ("cancel", {}), ("interrupt", {})):
        method = getattr(connection, name, None)
        if method is not None:
            try:
                method(**kwargs)
            except Exception:  # noqa: BLE001 - the connection is closed, or the server is gone
                log.debug("could not interrupt a database statement at shutdown", exc_info=True)
            return


def database_pool_counters(services: Services) -> dict[str, int] | None:
    """Connections of the pool in use and its limit (pool plus overflow), for /readyz; None for a pool that does not
    count them (SQLite in memory)."""
    checked_out = getattr(services.engine.pool, "checkedout", None)
    if checked_out is None:
        return None
    limits = pool_limits(services.settings)
    return {"in_use": checked_out(), "limit": limits.size + limits.overflow}


def pool_limits(settings: Settings) -> PoolLimits:
    """One connection per worker thread, and as many again for work outside the thread limit: admission
    checks a key on a limiter of its own (api/admission.py), FastAPI runs each session's teardown on a thread
    of its own, and the webhook loop and readiness checks share the pool."""
    threads = settings.api_worker_threads
    # No ping per checkout: on this path round trips are the cost that matters (two checkouts a request).
    # After a database restart the first request on a dead connection gets a 503 with Retry-After, and
    # SQLAlchemy replaces the pool's connections.
    return PoolLimits(size=threads, overflow=threads, timeout_seconds=settings.database_pool_timeout_seconds,
                      pre_ping=False)


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


async def get_services(request: Request) -> Services:
    return services_for(request.app)


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings(services: ServicesDep) -> Settings:
    return services.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def read_sessions(services: Services) -> sessionmaker[Session]:
    return services.read_session_factory or services.session_factory


READ_METHODS = frozenset({"GET", "HEAD"})


async def run_read(services: Services, work: Callable[..., T], *args: object) -> T:
    """`work(connection, *args)` on a worker thread, with a connection of its own (autocommit, read-only use),
    returned to the pool on that thread before the response is sent.

    The hot read routes (a job list, a job, its events and metrics) are `async def` and call this once: one thread
    hop for all of their database work, and FastAPI then validates and serialises the response on the event loop.
    A sync route costs two hops (the route, then FastAPI's response validation on another thread) plus the session
    dependency's work."""

    def call() -> T:
        with (services.read_engine or services.engine).connect() as connection:
            return work(connection, *args)

    return await anyio.to_thread.run_sync(call)


async def run_write(services: Services, work: Callable[..., T], *args: object) -> T:
    """`work(session, *args)` on a worker thread, with a session of its own whose transaction ends (rolled back if
    `work` left one open) and whose connection goes back to the pool on that same thread, before the route's
    answer is validated or sent. `work` returns the answer, built while the session was open.

    For write routes that lock rows: a sync route with `SessionDep` keeps its transaction (and its locks) until
    FastAPI has validated the answer on a second worker thread (see the module's docstring). If the client goes
    away meanwhile, the thread still finishes and ends the session: a thread is never abandoned halfway."""

    def call() -> T:
        session = services.session_factory()
        try:
            return work(session, *args)
        finally:
            release_session(session)

    return await anyio.to_thread.run_sync(call)


def release_session(session: Session) -> None:
    """Roll back whatever `session` left open and return its connection. Never raises: a connection the database
    closed meanwhile (the idle-in-transaction timeout, a restart) fails its rollback and is then discarded instead
    of going back to the pool; the request's answer, already made, stands."""
    try:
        session.close()
    except Exception:  # noqa: BLE001 - only the connection is lost, not the request's work
        log.warning("could not roll back a database session; its connection is discarded", exc_info=True)
        try:
            session.invalidate()
        except Exception:  # noqa: BLE001
            log.debug("could not discard the connection either", exc_info=True)


async def get_session(request: Request, services: ServicesDep) -> AsyncIterator[Session]:
    # Creating a session does no I/O, so it needs no thread. Closing one does I/O only when a transaction is
    # open (the rollback of anything the route did not commit): that runs on a thread outside the
    # worker-thread limit, as FastAPI does for sync teardowns, so a request holding a connection never
    # waits for a thread. A read session (autocommit) has nothing to roll back and closes right here.
    # In `finally`, shielded: the rollback and the close happen however the request ends (an answer, an
    # exception from the route, the client gone and the request cancelled), and they never raise.
    read_only = request.method in READ_METHODS
    session = (read_sessions(services) if read_only else services.session_factory)()
    try:
        yield session
    finally:
        with anyio.CancelScope(shield=True):
            if session.in_transaction() and not (read_only and services.read_session_factory is not None):
                await anyio.to_thread.run_sync(release_session, session, limiter=anyio.CapacityLimiter(1))
            else:
                release_session(session)


# scope="function": closed (connection returned) once the route function's answer is ready, before the response
# is sent, so a slow reader never pins a connection. For a sync route that is after FastAPI validated its answer
# on a worker thread: routes that lock rows use `run_write` instead (the module's docstring says why).
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

# Declares the bearer scheme in OpenAPI; the header itself is checked by `authenticate`
# so that every failure gets a problem+json body that says what to fix.
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer dsk_...`")


async def get_principal(
    request: Request,
    services: ServicesDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    # Admission control checked the key before the request could wait for a slot (api/admission.py) and left
    # the principal here; a request it let through unchecked (the database was down then) is checked now.
    principal = request.scope.get("state", {}).get(PRINCIPAL_STATE_KEY)
    if isinstance(principal, Principal):
        return principal

    def check() -> Principal:
        # A session of its own, closed here: the connection goes back to the pool before the route's thread
        # checks one out again.
        with read_sessions(services)() as session:
            return authenticate(session, services.settings, request.headers.get("authorization"))

    return await anyio.to_thread.run_sync(check)


def _require(scope: str):  # noqa: ANN202 - returns a dependency callable
    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(scope)
        return principal

    dependency.__name__ = f"require_{scope}"
    return dependency


ReadPrincipal = Annotated[Principal, Depends(_require("read"))]
WritePrincipal = Annotated[Principal, Depends(_require("write"))]
AdminPrincipal = Annotated[Principal, Depends(_require("admin"))]
