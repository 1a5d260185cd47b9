"""Admission control: who may hold one of the bounded places in progress, and when.

Under overload a server that queues without limit answers everything late (and, when the waits pile up
behind a shared resource, fails everything after 30 s). Here at most `2 × api_worker_threads` requests
are being handled at once; a request that cannot start within `api_queue_timeout_seconds` is answered
at once with 503 + `Retry-After`, so clients back off instead of stacking up.

A slot is the scarce thing, so a request earns one in this order (otherwise 80 keyless sockets trickling
multipart bodies at a byte a second hold every slot):
1. its API key is checked first, for every route that needs one (`/v1/...`, the dashboard's own calls), from
   the headers alone: a request without a valid key is answered 401 and never waits for, or holds, a slot,
   and its body is never read. The principal is handed to the route (`api.deps.get_principal`), so a
   request is still authenticated once. Key checks run on threads of their own (a bounded number, with the
   same bounded wait), so a flood of bad keys cannot take the threads the admitted requests run on;
2. its body is then read whole, bounded in size (`BodySizeLimitMiddleware`, outside) and in time
   (`api_body_timeout_seconds` for the whole body): a body that has not arrived by then is answered 408 and
   counted against its client (`/readyz` and `/metrics` show the counts); large bodies spool to disk;
3. only then does it wait for a slot, which is released when its response *starts*: by then the route's work
   is done, and an SSE stream or an artifact download that goes on sending for minutes does not keep a slot.

Liveness (`/healthz`) and readiness (`/readyz`, which reports saturation) are never queued. Saturation is more
than full slots: requests stuck on the database hold few slots but every worker thread (a lock they all wait for),
or every pooled connection, so `/readyz` also counts busy threads, connections in use, and requests that have held
a slot longer than `api_stalled_request_seconds` (stalled: the process is not ready while any is).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import Unauthenticated, problem_headers, problem_status, send_problem
from domain.settings import Settings

log = logging.getLogger("draftsmith.api")
UNQUEUED_PATHS = frozenset({"/healthz", "/readyz"})
SLOTS_PER_THREAD = 2  # a request is on a thread only part of its life (body, event loop work in between)
PRINCIPAL_STATE_KEY = "draftsmith.principal"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
SPOOL_IN_MEMORY_BYTES = 1 << 20  # larger bodies (uploads) wait on disk until the route reads them
REPLAY_CHUNK_BYTES = 64 * 1024
SLOW_CLIENTS_KEPT = 1024


def configure_thread_limiter(settings: Settings) -> None:
    """Size the running event loop's worker-thread pool (sync routes and dependencies run there)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_worker_threads


def retry_after_seconds(settings: Settings) -> int:
    return max(1, math.ceil(settings.api_queue_timeout_seconds / 2))


def needs_api_key(path: str) -> bool:
    """Routes that answer only with an API key: the REST API and the dashboard's calls (its page, assets and
    signed download links are public)."""
    return path.startswith("/v1/") or path == "/v1" or (
        path.startswith("/dashboard/") and not path.startswith("/dashboard/downloads/"))


@dataclass
class AdmissionState:
    """What `/readyz` and `/metrics` report about capacity (one per app; one API process)."""

    capacity: int = 0
    in_progress: int = 0
    waiting: int = 0
    refused_total: int = 0
    unauthenticated_total: int = 0
    body_timeouts_total: int = 0
    slow_clients: OrderedDict[str, int] = field(default_factory=OrderedDict)
    # When each request in progress took its slot (time.monotonic()), by a number of its own: the oldest tells a
    # process stuck on a lock from a busy one, which the counts alone cannot.
    started: dict[int, float] = field(default_factory=dict)
    stalled_after_seconds: float = 0.0  # api_stalled_request_seconds, once settings are read
    # The database pool's connections in use and its limit (api/deps.py database_pool_counters), once known.
    database: Callable[[], dict[str, int] | None] | None = None

    def watch(self, services: Any) -> None:
        """Read, besides the counters, the stall threshold of `services.settings` and its database pool."""
        from api.deps import database_pool_counters

        self.stalled_after_seconds = services.settings.api_stalled_request_seconds
        self.database = lambda: database_pool_counters(services)

    def count_slow_client(self, client: str) -> int:
        self.body_timeouts_total += 1
        count = self.slow_clients.pop(client, 0) + 1
        self.slow_clients[client] = count  # most recent last; the oldest is forgotten first
        while len(self.slow_clients) > SLOW_CLIENTS_KEPT:
            self.slow_clients.popitem(last=False)
        return count

    def report(self) -> dict[str, Any]:
        """This process's counters; called on the event loop (the worker-thread limiter is the loop's)."""
        worst = sorted(self.slow_clients.items(), key=lambda item: -item[1])[:5]
        now = time.monotonic()
        ages = [now - since for since in list(self.started.values())]
        stalled = sum(age > self.stalled_after_seconds for age in ages) if self.stalled_after_seconds > 0 else 0
        threads = _worker_threads()
        pool = self.database() if self.database is not None else None
        threads_full = threads["threads"] > 0 and threads["threads_busy"] >= threads["threads"]
        saturated = (
            (self.capacity > 0 and self.in_progress >= self.capacity)
            or (threads_full and threads["threads_waiting"] > 0)
            or (pool is not None and pool["in_use"] >= pool["limit"])
            or stalled > 0
        )
        # pid: the counters live in this process only (uvicorn --workers forks), so say whose they are.
        return {"pid": os.getpid(), "slots": self.capacity, "in_progress": self.in_progress, "waiting": self.waiting,
                "saturated": saturated,
                "refused_total": self.refused_total, "unauthenticated_total": self.unauthenticated_total,
                "body_timeouts_total": self.body_timeouts_total,
                "slow_clients": [{"client": client, "body_timeouts": count} for client, count in worst],
                **threads,
                "database_connections": pool["limit"] if pool else 0,
                "database_connections_in_use": pool["in_use"] if pool else 0,
                "oldest_in_progress_seconds": round(max(ages, default=0.0), 3), "stalled": stalled}


def _worker_threads() -> dict[str, int]:
    """The event loop's worker threads (sync routes, dependencies and database work run there): how many, how many
    are busy, and how many tasks wait for one. Zeros outside an event loop."""
    try:
        stats = anyio.to_thread.current_default_thread_limiter().statistics()
    except Exception:  # noqa: BLE001 - no running event loop (a report made outside the server)
        return {"threads": 0, "threads_busy": 0, "threads_waiting": 0}
    return {"threads": int(stats.total_tokens), "threads_busy": stats.borrowed_tokens,
            "threads_waiting": stats.tasks_waiting}


class AdmissionCollector(Collector):
    def __init__(self, state: AdmissionState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("draftsmith_admission_in_progress", "Requests holding a slot.",
                                value=self.state.in_progress)
        yield GaugeMetricFamily("draftsmith_admission_waiting", "Requests waiting for a slot.",
                                value=self.state.waiting)
        yield GaugeMetricFamily("draftsmith_admission_slots", "Slots of this process.", value=self.state.capacity)
        yield CounterMetricFamily("draftsmith_admission_refused", "Requests answered 503 after the queue timeout.",
                                  value=self.state.refused_total)
        yield CounterMetricFamily("draftsmith_body_timeouts", "Request bodies that did not arrive in time (408).",
                                  value=self.state.body_timeouts_total)


class _Body:
    """A request body read whole: in memory, or spooled to disk past SPOOL_IN_MEMORY_BYTES."""

    def __init__(self) -> None:
        self.spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 - closed below

    def replay(self, receive: Receive) -> Receive:
        """A `receive` that hands the stored body on in chunks, then waits for the client's disconnect."""
        size = self.spool.tell()
        self.spool.seek(0)
        done = False

        async def replayed() -> Message:
            nonlocal done
            if done:
                return await receive()  # after the body: wait for the disconnect, as the server would
            chunk = self.spool.read(REPLAY_CHUNK_BYTES)
            more = self.spool.tell() < size
            if not more:
                done = True
                self.spool.close()
            return {"type": "http.request", "body": chunk, "more_body": more}

        return replayed


class AdmissionControlMiddleware:
    def __init__(self, app: ASGIApp, services_getter: Callable[[], Any], state: AdmissionState) -> None:
        self.app = app
        self.services_getter = services_getter
        self.state = state
        self._slots: anyio.Semaphore | None = None
        self._key_checks: anyio.Semaphore | None = None
        self._key_threads: anyio.CapacityLimiter | None = None
        self._numbers = itertools.count()

    def _setup(self, services: Any) -> None:
        if self._slots is None:  # created on first use: settings are read lazily, like every service
            settings: Settings = services.settings
            self.state.watch(services)
            self.state.capacity = settings.api_worker_threads * SLOTS_PER_THREAD
            self._slots = anyio.Semaphore(self.state.capacity)
            checks = max(2, settings.api_worker_threads // 2)
            self._key_checks = anyio.Semaphore(checks)
            self._key_threads = anyio.CapacityLimiter(checks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNQUEUED_PATHS:
            await self.app(scope, receive, send)
            return
        services = self.services_getter()
        settings: Settings = services.settings
        self._setup(services)
        if needs_api_key(scope["path"]) and not await self._authenticate(scope, send, services):
            return
        body = None
        if scope["method"] in BODY_METHODS:
            body = await self._read_body(scope, receive, send, settings)
            if body is None:
                return
            receive = body.replay(receive)
        try:
            await self._admitted(scope, receive, send, settings)
        finally:
            if body is not None:
                body.spool.close()  # a route that answered without reading the body leaves no spool file

    async def _authenticate(self, scope: Scope, send: Send, services: Any) -> bool:
        """Check the request's key before it may wait for anything; False when it has been answered."""
        from api.auth import authenticate
        from api.deps import read_sessions

        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None

        def check() -> Any:
            with read_sessions(services)() as session:
                return authenticate(session, services.settings, authorization)

        settings = services.settings
        assert self._key_checks is not None
        started = False
        with anyio.move_on_after(settings.api_queue_timeout_seconds):
            await self._key_checks.acquire()
            started = True
        if not started:
            await self._refuse(scope, send, settings)
            return False
        try:
            principal = await anyio.to_thread.run_sync(check, limiter=self._key_threads)
        except Unauthenticated as exc:
            self.state.unauthenticated_total += 1
            await send_problem(scope, send, problem_status(exc), exc.slug, exc.title, exc.detail,
                               headers=problem_headers(exc))
            return False
        except Exception:  # the database is down, say: the route checks again and answers that properly
            log.warning("key check before admission failed; the route will check again", exc_info=True)
            return True
        finally:
            self._key_checks.release()
        scope.setdefault("state", {})[PRINCIPAL_STATE_KEY] = principal
        return True

    async def _read_body(self, scope: Scope, receive: Receive, send: Send, settings: Settings) -> _Body | None:
        """The whole body within `api_body_timeout_seconds`, or None when the request has been answered (408,
        413) or its client went away."""
        body = _Body()
        arrived = False
        try:
            with anyio.move_on_after(settings.api_body_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        body.spool.close()
                        return None  # the client went away; nothing to answer
                    body.spool.write(message.get("body", b""))
                    if not message.get("more_body", False):
                        arrived = True
                        break
        except HTTPException as exc:  # the size limit, raised while the body streamed in
            body.spool.close()
            await send_problem(scope, send, exc.status_code, "payload-too-large", "Upload too large", str(exc.detail),
                               headers={"Connection": "close"})
            return None
        if not arrived:
            body.spool.close()
            client = (scope.get("client") or ("unknown", 0))[0]
            count = self.state.count_slow_client(client)
            log.warning("request body from %s did not arrive within %g s (%d times from this client)", client,
                        settings.api_body_timeout_seconds, count)
            await send_problem(scope, send, 408, "request-timeout", "Request Timeout",
                               f"the request body did not arrive within {settings.api_body_timeout_seconds:g} s; "
                               "send it at once, or split a large upload", headers={"Connection": "close"})
            return None
        return body

    async def _admitted(self, scope: Scope, receive: Receive, send: Send, settings: Settings) -> None:
        slots = self._slots
        assert slots is not None
        admitted = False
        self.state.waiting += 1
        try:
            with anyio.move_on_after(settings.api_queue_timeout_seconds):
                await slots.acquire()
                admitted = True
        finally:
            self.state.waiting -= 1
        if not admitted:
            await self._refuse(scope, send, settings)
            return
        self.state.in_progress += 1
        number = next(self._numbers)
        self.state.started[number] = time.monotonic()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.state.in_progress -= 1
                self.state.started.pop(number, None)
                slots.release()

        async def send_and_release(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_and_release)
        finally:
            release()

    async def _refuse(self, scope: Scope, send: Send, settings: Settings) -> None:
        self.state.refused_total += 1
        retry_after = retry_after_seconds(settings)
        await send_problem(scope, send, 503, "service-unavailable", "Service unavailable",
                           f"the server is at capacity; retry in {retry_after} s",
                           headers={"Retry-After": str(retry_after)})
