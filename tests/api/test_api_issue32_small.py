"""Issue 32's smaller API items: a 405 lists every method of its path, the unknown-drafter 404s are in the OpenAPI
document, a queued job whose broker message was lost can be resumed, a missing field says what to put there, and
/readyz names the process whose counters it reports and lists every API process's, and `draftsmith api` serves
with uvicorn's C HTTP parser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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


def test_readyz_lists_every_api_process_with_totals(sqlite_harness, tmp_path):
    """Under `draftsmith api --workers N` each process counts for itself; /readyz answered by any one of them lists
    every live process's counters (as each last wrote them to the server's ProcessBoard) and adds them up."""
    from api.observability import ProcessBoard

    board_dir = tmp_path / "processes"
    board_dir.mkdir()
    sqlite_harness.client.app.state.process_board = ProcessBoard(str(board_dir), 2)
    sibling = os.getppid()  # a live process other than this one, standing in for the second worker
    (board_dir / f"{sibling}.json").write_text(json.dumps({
        "pid": sibling, "slots": 16, "in_progress": 1, "waiting": 0, "saturated": False, "refused_total": 3,
        "unauthenticated_total": 2, "body_timeouts_total": 1, "slow_clients": [], "published_at": time.time() - 1.5}))
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(finished.stdout)  # a worker that died: uvicorn replaced it, its file goes
    (board_dir / f"{gone}.json").write_text(json.dumps({"pid": gone, "refused_total": 100}))
    assert sqlite_harness.client.get("/v1/jobs").status_code == 401  # counted by this process

    ready = sqlite_harness.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    processes = body["processes"]
    assert processes["answered_by"] == body["capacity"]["pid"] == os.getpid()
    assert processes["configured"] == 2
    by_pid = {entry["pid"]: entry for entry in processes["reporting"]}
    assert sorted(by_pid) == sorted([os.getpid(), sibling])
    assert by_pid[os.getpid()]["age_seconds"] == 0 and by_pid[os.getpid()]["unauthenticated_total"] >= 1
    assert 1.0 <= by_pid[sibling]["age_seconds"] < 60 and by_pid[sibling]["refused_total"] == 3
    own = by_pid[os.getpid()]
    assert processes["totals"]["refused_total"] == own["refused_total"] + 3
    assert processes["totals"]["unauthenticated_total"] == own["unauthenticated_total"] + 2
    assert not (board_dir / f"{gone}.json").exists()
    # This process published its own numbers for the others to read.
    assert json.loads((board_dir / f"{os.getpid()}.json").read_text())["pid"] == os.getpid()
    schema = sqlite_harness.client.get("/openapi.json").json()["components"]["schemas"]
    assert "processes" in schema["ReadinessOut"]["properties"] and "ProcessesOut" in schema


def test_readyz_without_a_process_board_reports_this_process_only(sqlite_harness):
    """Served without `draftsmith api` (plain uvicorn, a test client): no board directory, one process listed."""
    processes = sqlite_harness.client.get("/readyz").json()["processes"]
    assert processes["configured"] is None and [p["pid"] for p in processes["reporting"]] == [os.getpid()]


def test_draftsmith_api_uses_httptools_and_gives_its_workers_a_process_board(tmp_path, monkeypatch):
    """`draftsmith api` serves with uvicorn's C HTTP parser (issue 32: h11 cost ~1 ms of CPU a request) and tells
    the worker processes where to show each other their counters, and how many they are."""
    import uvicorn
    from click.testing import CliRunner

    import api.cli
    from api.observability import PROCESS_COUNT_ENV, PROCESS_DIR_ENV

    seen = {}

    def run(app, **kwargs):
        seen.update(kwargs, app=app, directory=os.environ[PROCESS_DIR_ENV], count=os.environ[PROCESS_COUNT_ENV])
        seen["existed"] = os.path.isdir(seen["directory"])

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.setattr("migrations.revisions.require_current_schema", lambda url: None)
    monkeypatch.setenv("DRAFTSMITH_ENV", "development")
    monkeypatch.setenv("DRAFTSMITH_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.delenv(PROCESS_DIR_ENV, raising=False)
    monkeypatch.delenv(PROCESS_COUNT_ENV, raising=False)
    result = CliRunner().invoke(api.cli.api, ["--port", "8765", "--workers", "3"])
    assert result.exit_code == 0, result.output
    assert seen["app"] == "api.main:app" and seen["http"] == "httptools" and seen["workers"] == 3
    assert seen["count"] == "3" and seen["existed"] and not os.path.exists(seen["directory"])  # removed on exit
    import httptools  # noqa: F401 - a base dependency (pyproject.toml), so `http="httptools"` always starts
