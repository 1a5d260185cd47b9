"""Webhooks end to end: a real HTTP receiver on loopback checks Standard Webhooks signatures (verified
here independently of domain/deliveries.py), failures are retried with exponential backoff, and every
attempt is recorded and visible through the API."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from domain.deliveries import dispatch_due_webhooks
from domain.models import utcnow
from domain.states import Stage


class Receiver:
    """A tiny webhook endpoint: records each request; answers the queued status codes, then 204."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.responses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                          "body": body.decode()})
                status = receiver.responses.pop(0) if receiver.responses else 204
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/draftsmith"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def verify_standard_webhook(secret: str, headers: dict[str, str], body: str, tolerance_s: int = 300) -> None:
    """What a receiver does (per the Standard Webhooks spec), written from the spec, not our code."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.{body}".encode()
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    signatures = [part.split(",", 1)[1] for part in headers["webhook-signature"].split(" ") if part.startswith("v1,")]
    assert any(hmac.compare_digest(expected, sig) for sig in signatures), "signature mismatch"
    assert abs(time.time() - int(headers["webhook-timestamp"])) < tolerance_s


def test_webhooks_signed_delivered_and_retried(harness, receiver):
    org = harness.new_org()
    created = harness.client.post("/v1/webhooks", headers=org.headers,
                                  json={"url": receiver.url, "description": "ci"})
    assert created.status_code == 201, created.text
    hook = created.json()
    secret = hook["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert "secret" not in harness.client.get(f"/v1/webhooks/{hook['id']}", headers=org.headers).json()
    # Only failures are interesting to this second endpoint.
    failures_only = harness.client.post("/v1/webhooks", headers=org.headers,
                                        json={"url": receiver.url + "/failures", "events": ["job.failed"]}).json()

    job_id = harness.create_job(org)["id"]
    harness.runner.run_to_end(job_id)
    factory, settings = harness.services.session_factory, harness.settings
    receiver.responses = [500]  # the first delivery attempt fails
    now = utcnow()
    assert dispatch_due_webhooks(factory, settings, now=now) == 8  # started + 6 stage changes + succeeded
    assert len(receiver.requests) == 8

    for request in receiver.requests:
        verify_standard_webhook(secret, request["headers"], request["body"])
        assert request["headers"]["webhook-id"].startswith("msg_")
    events = [json.loads(r["body"]) for r in receiver.requests]
    assert all(e["data"]["id"] == job_id for e in events)
    delivered = [e["type"] for e in events[1:]]
    assert delivered == ["job.stage_changed"] * 6 + ["job.succeeded"]  # events[0] got the 500
    assert [e["data"]["status"] for e in events if e["type"] == "job.stage_changed"][-1] == "publishing"
    failed_first = receiver.requests[0]

    # The failed one is retried only when its backoff has passed: base (5 s) after the first failure.
    assert dispatch_due_webhooks(factory, settings, now=now + timedelta(seconds=4)) == 0
    receiver.responses = [503]
    assert dispatch_due_webhooks(factory, settings, now=now + timedelta(seconds=6)) == 1
    assert dispatch_due_webhooks(factory, settings, now=now + timedelta(seconds=6 + 9)) == 0  # now waits 10 s
    assert dispatch_due_webhooks(factory, settings, now=now + timedelta(seconds=6 + 11)) == 1
    retried = receiver.requests[-1]
    assert retried["headers"]["webhook-id"] == failed_first["headers"]["webhook-id"]  # same message id
    assert retried["body"] == failed_first["body"]
    verify_standard_webhook(secret, retried["headers"], retried["body"])

    deliveries = harness.client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=org.headers).json()["data"]
    assert len(deliveries) == 8 and all(d["status"] == "succeeded" for d in deliveries)
    started = next(d for d in deliveries if d["event_type"] == "job.started")
    assert [(a["attempt"], a["status_code"], a["succeeded"]) for a in started["attempts"]] == [
        (1, 500, False), (2, 503, False), (3, 204, True),
    ]
    assert harness.client.get(f"/v1/webhooks/{failures_only['id']}/deliveries",
                              headers=org.headers).json()["data"] == []

    # A failing job reaches the failures-only endpoint too.
    failing = harness.create_job(org)["id"]
    harness.runner.run_to_end(failing, fail_at=Stage.GENERATE)
    dispatch_due_webhooks(factory, settings, now=now + timedelta(seconds=60))
    to_failures = [body for body in (json.loads(r["body"]) for r in receiver.requests) if body["type"] == "job.failed"]
    assert len(to_failures) == 2  # both endpoints want job.failed
    assert to_failures[0]["data"]["error"] == {"code": "fake_failure", "message": "injected failure in generate",
                                               "stage": "generate"}


def test_delivery_gives_up_after_max_attempts(harness, receiver):
    org = harness.new_org()
    harness.client.post("/v1/webhooks", headers=org.headers, json={"url": receiver.url, "events": ["job.cancelled"]})
    job_id = harness.create_job(org)["id"]
    harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    factory, settings = harness.services.session_factory, harness.settings
    receiver.responses = [500] * 50
    moment = utcnow()
    for _ in range(settings.webhook_max_attempts + 2):
        dispatch_due_webhooks(factory, settings, now=moment)
        moment += timedelta(seconds=settings.webhook_backoff_max_seconds + 1)
    assert len(receiver.requests) == settings.webhook_max_attempts
    hook_id = harness.client.get("/v1/webhooks", headers=org.headers).json()["data"][0]["id"]
    (delivery,) = harness.client.get(f"/v1/webhooks/{hook_id}/deliveries", headers=org.headers).json()["data"]
    assert delivery["status"] == "failed" and delivery["next_attempt_at"] is None
    assert len(delivery["attempts"]) == settings.webhook_max_attempts


def test_webhook_crud_and_validation(harness, receiver, tmp_path):
    org, other = harness.new_org(), harness.new_org()
    hook = harness.client.post("/v1/webhooks", headers=org.headers, json={"url": receiver.url}).json()
    assert sorted(hook["events"]) == sorted(["job.cancelled", "job.failed", "job.stage_changed", "job.started",
                                             "job.succeeded"])
    patched = harness.client.patch(f"/v1/webhooks/{hook['id']}", headers=org.headers,
                                   json={"enabled": False, "events": ["job.failed"]})
    assert patched.status_code == 200 and patched.json()["enabled"] is False
    url = f"/v1/webhooks/{hook['id']}"
    described = harness.client.patch(url, headers=org.headers, json={"description": "ci",
                                                                     "events": ["job.started", "job.failed"] * 2})
    assert described.json()["description"] == "ci" and described.json()["events"] == ["job.failed", "job.started"]
    kept = harness.client.patch(url, headers=org.headers, json={"enabled": True}).json()  # unnamed fields stay
    assert kept["description"] == "ci" and kept["enabled"] is True and kept["events"] == ["job.failed", "job.started"]
    assert harness.client.patch(url, headers=org.headers, json={"description": None}).json()["description"] is None
    assert harness.client.get(f"/v1/webhooks/{hook['id']}", headers=other.headers).status_code == 404
    assert harness.client.delete(f"/v1/webhooks/{hook['id']}", headers=other.headers).status_code == 404
    for body, field in (({"url": "ftp://example.com"}, "url"), ({"url": receiver.url, "events": ["job.exploded"]},
                        "events.0"), ({"url": receiver.url, "events": []}, "events")):
        response = harness.client.post("/v1/webhooks", headers=org.headers, json=body)
        assert response.status_code == 422 and response.json()["errors"][0]["field"] == field, response.text
    assert harness.client.delete(f"/v1/webhooks/{hook['id']}", headers=org.headers).status_code == 204
    assert harness.client.get("/v1/webhooks", headers=org.headers).json()["data"] == []

    # Production default: no loopback/private targets (server-side request forgery).
    from domain.egress import EgressPolicy, EgressRefused

    strict = EgressPolicy()
    for url, word in (("http://10.0.0.8/hook", "private"), ("http://localhost:8080/hook", "loopback"),
                      ("http://127.0.0.1/hook", "loopback"), ("https://u:p@hooks.example.com/x", "credentials")):
        with pytest.raises(EgressRefused, match=word):
            strict.check_url(url)
    assert strict.check_url("https://hooks.example.com/x").host == "hooks.example.com"


def test_the_app_sends_due_deliveries_on_its_own(sqlite_url, tmp_path, receiver):
    """With the dispatch loop on (as in production), nobody needs to call the dispatcher."""
    from api_harness import build_harness, make_settings

    settings = make_settings(sqlite_url, tmp_path, webhook_dispatch_interval_seconds=0.1)
    for harness in build_harness(settings):
        org = harness.new_org()
        hook = harness.client.post("/v1/webhooks", headers=org.headers,
                                   json={"url": receiver.url, "events": ["job.cancelled"]}).json()
        job_id = harness.create_job(org)["id"]
        harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
        deadline = time.monotonic() + 10
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        (request,) = receiver.requests
        verify_standard_webhook(hook["secret"], request["headers"], request["body"])
        assert json.loads(request["body"])["type"] == "job.cancelled"
