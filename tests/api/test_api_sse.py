"""Server-Sent Events against a real uvicorn server on loopback (SQLite and PostgreSQL): events arrive
live and in order while the fake worker runs, the stream ends when the job does, and a reconnect
with Last-Event-ID continues exactly after the last event received."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from api_harness import Harness, build_harness, make_settings

from api.main import create_app


class LiveServer:
    def __init__(self, app) -> None:  # noqa: ANN001
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live(database_url: str, tmp_path: Path) -> Iterator[tuple[Harness, str]]:
    settings = make_settings(database_url, tmp_path / "storage")
    for harness in build_harness(settings):
        app = create_app(settings)
        app.state.services = harness.services  # same database, storage and queue as the harness
        with LiveServer(app) as base_url:
            yield harness, base_url


def read_sse(client: httpx.Client, url: str, headers: dict[str, str], into: queue.Queue) -> None:
    """Parse an SSE stream into (id, event, data) tuples; None marks the end of the stream."""
    try:
        with client.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}) as response:
            into.put(("status", response.status_code, None))
            event_id, event_name, data = None, "message", []
            for line in response.iter_lines():
                if line == "":
                    if data:
                        into.put((event_id, event_name, json.loads("\n".join(data))))
                    event_id, event_name, data = None, "message", []
                elif line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("event: "):
                    event_name = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
    finally:
        into.put(None)


def next_item(items: queue.Queue, timeout: float = 10.0):  # noqa: ANN201
    return items.get(timeout=timeout)


def test_sse_streams_live_in_order_and_resumes(live):
    harness, base_url = live
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    items: queue.Queue = queue.Queue()
    with httpx.Client(base_url=base_url, timeout=30) as client:
        reader = threading.Thread(target=read_sse, args=(client, f"/v1/jobs/{job_id}/events", org.headers, items))
        reader.start()
        assert next_item(items) == ("status", 200, None)
        created = next_item(items)
        assert created[0] == 1 and created[2]["type"] == "job.created"

        # Live: each stage's events reach the open stream before the next stage starts.
        received = [created]
        for _ in range(6):
            harness.runner.run_stage(job_id)
            with harness.services.session_factory() as session:
                from domain.events import events_after

                written = len(events_after(session, job_id, 0, 10_000))
            while received[-1][0] < written:
                received.append(next_item(items))
        end = next_item(items)
        assert end[1] == "end" and end[2] == {"job_id": job_id, "status": "succeeded"}
        assert next_item(items) is None  # the server closed the stream
        reader.join(timeout=5)

        ids = [item[0] for item in received]
        assert ids == list(range(1, len(ids) + 1))
        assert received[-1][2]["type"] == "job.status_changed" and received[-1][2]["data"]["to"] == "succeeded"
        paged = client.get(f"/v1/jobs/{job_id}/events?limit=1000", headers=org.headers).json()["data"]
        assert [item[2] for item in received] == paged  # the stream and the JSON pages agree

        # Reconnect after event 5: exactly the events 6..N, then the end marker.
        resumed: queue.Queue = queue.Queue()
        read_sse(client, f"/v1/jobs/{job_id}/events", {**org.headers, "Last-Event-ID": "5"}, resumed)
        assert resumed.get_nowait() == ("status", 200, None)
        tail = []
        while (item := resumed.get_nowait()) is not None:
            tail.append(item)
        assert [item[0] for item in tail[:-1]] == ids[5:] and tail[-1][1] == "end"

        # Nothing newer on a finished job: 204 tells EventSource clients to stop reconnecting.
        done: queue.Queue = queue.Queue()
        read_sse(client, f"/v1/jobs/{job_id}/events", {**org.headers, "Last-Event-ID": str(ids[-1])}, done)
        assert done.get_nowait() == ("status", 204, None)

        bad = client.get(f"/v1/jobs/{job_id}/events",
                         headers={**org.headers, "Accept": "text/event-stream", "Last-Event-ID": "abc"})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "Last-Event-ID"


def test_sse_stream_ends_on_cancellation(live):
    harness, base_url = live
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    harness.runner.run_stage(job_id, finish=False)
    items: queue.Queue = queue.Queue()
    with httpx.Client(base_url=base_url, timeout=30) as client:
        reader = threading.Thread(target=read_sse, args=(client, f"/v1/jobs/{job_id}/events?after=2", org.headers,
                                                         items))
        reader.start()
        assert next_item(items) == ("status", 200, None)
        assert next_item(items)[0] == 3  # `after` works like Last-Event-ID
        assert client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers).json()["status"] == "cancelling"
        harness.runner.run_to_end(job_id)  # the worker observes the request and acknowledges it
        events = []
        while (item := next_item(items)) is not None:
            events.append(item)
        reader.join(timeout=5)
    assert events[-1][1] == "end" and events[-1][2]["status"] == "cancelled"
    statuses = [e[2]["data"]["to"] for e in events[:-1] if e[2]["type"] == "job.status_changed"]
    assert statuses == ["cancelling", "cancelled"]
