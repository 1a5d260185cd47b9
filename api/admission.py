"""Admission control: a bounded number of requests in progress, a bounded wait for the rest.

Under overload a server that queues without limit answers everything late (and, when the waits pile up
behind a shared resource, fails everything after 30 s). Here at most `2 × api_worker_threads` requests
are being handled at once; a request that cannot start within `api_queue_timeout_seconds` is answered
at once with 503 + `Retry-After`, so clients back off instead of stacking up.

A request's slot is released when its response *starts*: by then the route's work is done, and an SSE
stream or an artifact download that goes on sending for minutes does not keep a slot. Liveness
(`/healthz`) is never queued: a busy process is still alive.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import anyio
import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE
from api.settings import Settings

UNQUEUED_PATHS = frozenset({"/healthz"})
SLOTS_PER_THREAD = 2  # a request is on a thread only part of its life (body, event loop work in between)


def configure_thread_limiter(settings: Settings) -> None:
    """Size the running event loop's worker-thread pool (sync routes and dependencies run there)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_worker_threads


def retry_after_seconds(settings: Settings) -> int:
    return max(1, math.ceil(settings.api_queue_timeout_seconds / 2))


class AdmissionControlMiddleware:
    def __init__(self, app: ASGIApp, settings_getter: Callable[[], Settings]) -> None:
        self.app = app
        self.settings_getter = settings_getter
        self._slots: anyio.Semaphore | None = None

    def _semaphore(self, settings: Settings) -> anyio.Semaphore:
        if self._slots is None:  # created on first use: settings are read lazily, like every service
            self._slots = anyio.Semaphore(settings.api_worker_threads * SLOTS_PER_THREAD)
        return self._slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNQUEUED_PATHS:
            await self.app(scope, receive, send)
            return
        settings = self.settings_getter()
        slots = self._semaphore(settings)
        admitted = False
        with anyio.move_on_after(settings.api_queue_timeout_seconds):
            await slots.acquire()
            admitted = True
        if not admitted:
            await _refuse(scope, send, settings)
            return
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                slots.release()

        async def send_and_release(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_and_release)
        finally:
            release()


async def _refuse(scope: Scope, send: Send, settings: Settings) -> None:
    retry_after = retry_after_seconds(settings)
    body = json.dumps({
        "type": PROBLEM_TYPE_BASE + "service-unavailable",
        "title": "Service unavailable",
        "status": 503,
        "detail": f"the server is at capacity; retry in {retry_after} s",
        "instance": scope["path"],
    }).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(retry_after).encode())]})
    await send({"type": "http.response.body", "body": body})
