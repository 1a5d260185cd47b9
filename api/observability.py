"""Prometheus metrics and request-level ASGI middleware (metrics, body-size limits).

Per-process request counters live in a registry owned by the app (not the global one, so several
apps in one test process don't collide). Job and webhook gauges are read from the database at
scrape time: they are then correct however many API processes run.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE
from api.schemas import ProcessCapacityOut
from domain.job_reads import jobs_by_status
from domain.states import JobStatus
from domain.webhooks import deliveries_by_status

log = logging.getLogger("draftsmith.api")


class DatabaseCollector(Collector):
    def __init__(self, services_getter: Callable[[], object]) -> None:
        self._services = services_getter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("draftsmith_jobs", "Jobs by status (all organisations).", labels=["status"])
        deliveries = GaugeMetricFamily("draftsmith_webhook_deliveries", "Webhook deliveries by status.",
                                       labels=["status"])
        try:
            services = self._services()
            with services.session_factory() as session:  # type: ignore[attr-defined]
                counts = jobs_by_status(session)
                delivery_counts = deliveries_by_status(session)
        except Exception:  # a scrape must not fail because the database is down; /readyz reports that
            log.warning("metrics: database unavailable", exc_info=True)
            return
        for status in JobStatus:
            jobs.add_metric([str(status)], counts.get(str(status), 0))
        for status in ("pending", "succeeded", "failed"):
            deliveries.add_metric([status], delivery_counts.get(status, 0))
        yield jobs
        yield deliveries


class ApiMetrics:
    def __init__(self, services_getter: Callable[[], object]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("draftsmith_http_requests", "HTTP requests handled.",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("draftsmith_http_request_duration_seconds", "Time to the end of the response.",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60))
        self.registry.register(DatabaseCollector(services_getter))


# Set by `draftsmith api` (api/cli.py) for the worker processes it starts: a directory of their own, and how many.
PROCESS_DIR_ENV = "DRAFTSMITH_API_PROCESS_DIR"
PROCESS_COUNT_ENV = "DRAFTSMITH_API_PROCESSES"
PUBLISH_INTERVAL_SECONDS = 2.0
_COUNTERS = ("in_progress", "waiting", "refused_total", "unauthenticated_total", "body_timeouts_total", "stalled")
# A process's snapshot is a few hundred bytes; anything far larger in the folder is not one.
MAX_SNAPSHOT_BYTES = 64 * 1024


class ProcessBoard:
    """Where the API processes of one server (`draftsmith api --workers N`) show each other their capacity counters.

    Each process keeps its own counters (uvicorn forks the workers; the kernel hands each connection to one of
    them), so `/readyz` from one process alone says nothing about the others. Every process writes its snapshot
    to `<directory>/<pid>.json` (at each `/readyz` and every PUBLISH_INTERVAL_SECONDS), and `/readyz` reads them
    all: the answering process's own numbers, fresh, and every other live process's as it last wrote them, with
    their age. Files of processes that are gone (uvicorn replaces a dead worker) are removed. Without a directory
    (the app served by plain `uvicorn`, or a test client) the board knows this process only.

    A file that is not a snapshot (not JSON, not an object, a field missing or of the wrong type, another pid than
    its name's, too large) is left out of the report and logged once: one bad file in the folder must not turn
    every /readyz of the server into a 500."""

    def __init__(self, directory: str | None, configured: int | None) -> None:
        self.directory = Path(directory) if directory else None
        self.configured = configured
        self._reported: set[tuple[str, float]] = set()  # (file, mtime) of the malformed files already logged

    @classmethod
    def from_environment(cls) -> ProcessBoard:
        count = os.environ.get(PROCESS_COUNT_ENV, "")
        return cls(os.environ.get(PROCESS_DIR_ENV) or None, int(count) if count.isdigit() else None)

    def publish(self, snapshot: dict[str, Any]) -> None:
        if self.directory is None:
            return
        try:
            with tempfile.NamedTemporaryFile("w", dir=self.directory, prefix=".", suffix=".tmp", delete=False) as out:
                json.dump({**snapshot, "published_at": time.time()}, out)
            os.replace(out.name, self.directory / f"{snapshot['pid']}.json")  # readers never see half a file
        except OSError:
            log.warning("could not publish this process's counters to %s", self.directory, exc_info=True)

    def report(self, own: dict[str, Any]) -> dict[str, Any]:
        """Every API process's counters (this one's `own`, fresh), by pid, and their totals."""
        self.publish(own)
        processes = {own["pid"]: {**own, "age_seconds": 0.0}}
        now = time.time()
        for path in sorted(self.directory.glob("*.json")) if self.directory is not None else []:
            try:
                pid = int(path.stem)
                if pid <= 0 or pid in processes:
                    continue  # 0 and negative "pids" would name process groups to _alive
                if not _alive(pid):
                    path.unlink(missing_ok=True)
                    continue
                entry = self._entry(path, pid, now)
            except (OSError, ValueError):
                continue  # not ours, or just replaced: the next report reads it
            if entry is not None:
                processes[pid] = entry
        reporting = [processes[pid] for pid in sorted(processes)]
        return {"answered_by": own["pid"], "configured": self.configured, "reporting": reporting,
                "totals": {name: sum(int(p.get(name, 0)) for p in reporting) for name in _COUNTERS}}

    def _entry(self, path: Path, pid: int, now: float) -> dict[str, Any] | None:
        """The snapshot in `path`, checked as /readyz will answer it; None (logged once) when it is not one."""
        stat = path.stat()
        problem = None
        if stat.st_size > MAX_SNAPSHOT_BYTES:
            problem = f"larger than {MAX_SNAPSHOT_BYTES} bytes"
        else:
            try:
                snapshot = json.loads(path.read_text())
                if not isinstance(snapshot, dict):
                    raise TypeError(f"a JSON {type(snapshot).__name__}, not an object")
                published = snapshot.pop("published_at", now)
                if isinstance(published, bool) or not isinstance(published, (int, float)):
                    raise TypeError("published_at is not a time")
                entry = ProcessCapacityOut.model_validate(
                    {**snapshot, "age_seconds": round(max(0.0, now - published), 3)}).model_dump()
                if entry["pid"] != pid:
                    raise ValueError(f"it names pid {entry['pid']}")
                return entry
            except ValidationError as exc:
                problem = f"{exc.error_count()} invalid field(s), first {exc.errors()[0]['loc']}"
            except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
                problem = str(exc)[:200]
        if (str(path), stat.st_mtime) not in self._reported:
            self._reported.add((str(path), stat.st_mtime))
            log.warning("process board: %s is not a process snapshot (%s); left out of /readyz", path.name, problem)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class RequestMetricsMiddleware:
    """Counts requests by route *template* (`/v1/jobs/{job_id}`), so ids don't explode label sets."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_holder = {"status": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route, str(status_holder["status"])).inc()
            self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - started)


class BodySizeLimitMiddleware:
    """Refuse request bodies over a per-path limit with a 413 problem, before they are buffered.

    A declared Content-Length over the limit is refused at once; a chunked body is counted as it
    streams and the route's body read fails with 413 (raised as an HTTPException inside the route,
    where the app's problem handler renders it).
    """

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, send, limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body larger than {limit} bytes")
            return message

        await self.app(scope, limited_receive, send)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, limit: int) -> None:
        body = json.dumps({
            "type": PROBLEM_TYPE_BASE + "payload-too-large",
            "title": "Upload too large",
            "status": 413,
            "detail": f"request body larger than {limit} bytes; for prompts files, split the file",
            "instance": scope["path"],
        }).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
