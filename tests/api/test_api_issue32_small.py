"""Issue 32's smaller API items: a 405 lists every method of its path, the unknown-drafter 404s are in the OpenAPI
document, a queued job whose broker message was lost can be resumed, a missing field says what to put there, and
/readyz names the process whose counters it reports."""

from __future__ import annotations

import os
import re
from datetime import timedelta

from sqlalchemy import update

from domain.jobs import QUEUED_PRESUMED_LOST_SECONDS
from domain.models import Job, utcnow

UNKNOWN_DRAFTER = "drf_01JABCDEFGHJKMNPQRSTVWXYZ0"
WARM_START = {"target": {"uri": "bundled:smollm2-135m"}, "init": {"from_drafter": UNKNOWN_DRAFTER}}


def test_a_405_allows_every_method_its_path_serves(sqlite_harness):
    """Starlette answered from the first route that matched the path: PATCH /v1/jobs said `Allow: POST`."""
    org = sqlite_harness.new_org()
    doc = sqlite_harness.client.get("/openapi.json").json()
    patterns = {template: re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
                for template in doc["paths"]}
    checked = 0
    for template in doc["paths"]:
        path = re.sub(r"\{[^}]+\}", "x", template)
        # Every template the path matches: /v1/jobs/estimate is also /v1/jobs/{job_id}, which GET serves.
        documented = {method.upper() for other, pattern in patterns.items() if pattern.match(path)
                      for method in doc["paths"][other]}
        for method in {"PUT", "PATCH", "DELETE", "POST"} - documented:
            response = sqlite_harness.client.request(method, path, headers=org.headers)
            assert response.status_code == 405, (method, path, response.text)
            assert set(response.headers["allow"].split(", ")) == documented, (method, path)
            detail = response.json()["detail"]
            assert detail.startswith(f"{method} is not allowed on {path}; use "), detail
            assert all(allowed in detail for allowed in documented), detail
            checked += 1
    assert checked > 50
    response = sqlite_harness.client.patch("/v1/jobs", headers=org.headers)
    assert response.headers["allow"] == "GET, POST"


def test_unknown_drafter_ids_are_404s_the_openapi_document_declares(sqlite_harness):
    org = sqlite_harness.new_org()
    paths = sqlite_harness.client.get("/openapi.json").json()["paths"]
    for method, path, body in (("post", "/v1/jobs", WARM_START), ("post", "/v1/jobs/estimate", WARM_START),
                               ("get", f"/v1/drafters/{UNKNOWN_DRAFTER}", None)):
        template = "/v1/drafters/{drafter_id}" if path.startswith("/v1/drafters/") else path
        declared = paths[template][method]["responses"]
        assert "404" in declared, (method, template, sorted(declared))
        assert "drafter" in declared["404"]["description"]
        assert declared["404"]["content"]["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
        response = sqlite_harness.client.request(method.upper(), path, json=body, headers=org.headers)
        assert response.status_code == 404 and UNKNOWN_DRAFTER in response.json()["detail"], response.text


def test_a_missing_target_says_which_field_to_set_and_how_it_looks(sqlite_harness):
    org = sqlite_harness.new_org()
    for body in ({}, {"target": {}}):
        response = sqlite_harness.client.post("/v1/jobs", json=body, headers=org.headers)
        assert response.status_code == 422
        message = response.json()["errors"][0]["message"]
        assert message.startswith("required: set target.uri (where the target lives: hf://"), message
        assert "e.g. bundled:smollm2-135m" in message


def test_a_queued_job_whose_message_was_lost_can_be_resumed(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    assert harness.services.queue.job_ids().count(job_id) == 1

    # Just queued: waiting for a worker is not a lost message.
    early = harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers)
    assert early.status_code == 409 and early.json()["job_status"] == "queued"
    assert f"after {QUEUED_PRESUMED_LOST_SECONDS} s" in early.json()["detail"]
    assert 0 < int(early.headers["Retry-After"]) <= QUEUED_PRESUMED_LOST_SECONDS + 1
    assert harness.services.queue.job_ids().count(job_id) == 1

    # Nothing has happened to it for longer than the threshold: the message is presumed lost and sent again.
    with harness.services.session_factory() as session:
        session.execute(update(Job).where(Job.id == job_id).values(
            updated_at=utcnow() - timedelta(seconds=QUEUED_PRESUMED_LOST_SECONDS + 5)))
        session.commit()
    resumed = harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "queued" and resumed.json()["resume_count"] == 1
    assert harness.services.queue.job_ids().count(job_id) == 2
    events = harness.client.get(f"/v1/jobs/{job_id}/events", headers=org.headers).json()["data"]
    requeued = [e for e in events if e["type"] == "job.resumed"]
    assert len(requeued) == 1 and requeued[0]["data"]["requeued"] is True
    assert requeued[0]["data"]["resume_stage"] == "prepare"
    # ... which touched it: a second resume right away is refused again, not a third message.
    assert harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers).status_code == 409

    # The duplicate it may have made is harmless: the worker runs the job once (the stage claim decides).
    harness.runner.run_to_end(job_id)
    assert harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()["status"] == "succeeded"
    assert harness.runner.run_stage(job_id) is None


def test_readyz_names_the_process_whose_counters_it_reports(sqlite_harness):
    capacity = sqlite_harness.client.get("/readyz").json()["capacity"]
    assert capacity["pid"] == os.getpid()  # the TestClient serves in this process
    schema = sqlite_harness.client.get("/openapi.json").json()["components"]["schemas"]["CapacityOut"]
    assert "pid" in schema["required"] and "each process counts" in schema["description"]
