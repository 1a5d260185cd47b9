"""The real broker paths. Redis on 127.0.0.1:6379: /readyz checks it, a created job's
`draftsmith.run_job` message lands in the Redis queue, and a dead broker gives 503 problems (each
test uses its own queue name so a worker running on this machine never consumes our messages).
The embedded `filesystem://` broker: the message lands as a file."""

from __future__ import annotations

import base64
import json
import secrets
import socket
from collections.abc import Iterator

import pytest
import redis
from api_harness import build_harness, make_settings

from domain.queue import RUN_JOB_TASK, CeleryQueue

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def queue_name() -> Iterator[str]:
    name = f"draftsmith-test-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        raise RuntimeError(f"Redis at {REDIS_URL} is required for the broker test: {exc}") from exc
    yield name
    client.delete(f"{name}.gpu", f"{name}.cpu")
    client.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_readyz_and_enqueue_through_redis(sqlite_url, tmp_path, queue_name):
    settings = make_settings(sqlite_url, tmp_path, broker_url=REDIS_URL, queue_name=queue_name)
    for harness in build_harness(settings):
        ready = harness.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "schema": "ok", "broker": "ok"}

        org = harness.new_org()
        job_id = harness.create_job(org)["id"]
        # A new job starts at prepare: the gpu queue (schemas/stages.py).
        messages = redis.Redis.from_url(REDIS_URL).lrange(f"{queue_name}.gpu", 0, -1)
        assert len(messages) == 1
        message = json.loads(messages[0])
        assert message["headers"]["task"] == RUN_JOB_TASK
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        assert args == [job_id] and kwargs == {}
        assert message["properties"]["delivery_info"]["routing_key"] == f"{queue_name}.gpu"


def test_dead_broker_means_not_ready_and_a_resumable_job(sqlite_url, tmp_path, queue_name):
    dead = f"redis://127.0.0.1:{_closed_port()}/0"
    settings = make_settings(sqlite_url, tmp_path, broker_url=dead, queue_name=queue_name)
    for harness in build_harness(settings):
        ready = harness.client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["content-type"] == "application/problem+json"
        assert ready.json()["checks"]["database"] == "ok" and ready.json()["checks"]["broker"].startswith("error")
        assert harness.client.get("/healthz").json() == {"status": "ok"}  # alive, just not ready

        org = harness.new_org()
        response = harness.client.post("/v1/jobs", json={"target": {"uri": "bundled:smollm2-135m"}},
                                       headers=org.headers)
        assert response.status_code == 503 and "resume" in response.json()["detail"]
        job_id = response.json()["job_id"]
        job = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
        assert job["status"] == "failed" and job["error"]["code"] == "enqueue_failed"

        # The broker is back: resuming enqueues the same job.
        harness.services.queue = CeleryQueue(make_settings(sqlite_url, tmp_path, broker_url=REDIS_URL,
                                                           queue_name=queue_name))
        resumed = harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers)
        assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
        assert redis.Redis.from_url(REDIS_URL).llen(f"{queue_name}.gpu") == 1  # it resumes at prepare


def test_embedded_filesystem_broker(sqlite_url, tmp_path):
    """The embedded default (no servers): messages are files the worker picks up from a folder."""
    folder = tmp_path / "broker"
    settings = make_settings(sqlite_url, tmp_path, broker_url="filesystem://", broker_folder=str(folder))
    for harness in build_harness(settings):
        assert harness.client.get("/readyz").json()["checks"]["broker"] == "ok"
        job_id = harness.create_job(harness.new_org())["id"]
        (message_file,) = (folder / "queue").glob("*.msg")
        message = json.loads(message_file.read_text())
        assert message["headers"]["task"] == RUN_JOB_TASK
        assert json.loads(base64.b64decode(message["body"]))[0] == [job_id]


def test_a_resumed_job_goes_to_the_queue_of_its_next_stage(sqlite_harness):
    from domain.queue import queue_for
    from domain.states import Stage

    org, queue = sqlite_harness.new_org(), sqlite_harness.services.queue
    job_id = sqlite_harness.create_job(org)["id"]
    assert queue.stages[-1] == "prepare" and queue_for(sqlite_harness.settings, "prepare").endswith(".gpu")
    assert sqlite_harness.runner.run_to_end(job_id, fail_at=Stage.EXPORT) == "failed"
    assert sqlite_harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers).status_code == 200
    assert queue.stages[-1] == "export" and queue_for(sqlite_harness.settings, "export").endswith(".cpu")
