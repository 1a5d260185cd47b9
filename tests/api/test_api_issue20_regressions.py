"""Issue 20's probe classes that were 500s, hangs or silent wrong answers, each now a 4xx naming the problem (or
working as documented), on PostgreSQL: invalid download tokens, an out-of-range usage period, SSE cursors
beyond a job's last event, a symbolic link loop, the API docs' assets, an estimate for an uploaded file, caps on
prompts per file and per job. (Races, slow bodies and the access log need a real server:
test_api_concurrency.py.)"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest
from api_harness import Harness, build_harness, make_settings

from api.dashboard.router import DASHBOARD_STATIC

MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


@pytest.fixture
def pg(module_postgres_url, tmp_path) -> Iterator[Harness]:
    yield from build_harness(make_settings(module_postgres_url, tmp_path / "storage",
                                           allowed_file_roots=[str(tmp_path / "models")],
                                           max_upload_bytes=4 * 1024 * 1024))


def field_of(response) -> str:  # noqa: ANN001
    return response.json()["errors"][0]["field"]


def test_invalid_download_tokens_are_404(pg):
    for token in ("%C3%A9.%C3%A9", "x.%C3%A9", "%FF.%FF", "a.b", "x" * 5000 + ".y"):
        response = pg.client.get(f"/dashboard/downloads/{token}")
        assert response.status_code == 404 and "invalid or has expired" in response.json()["detail"], token


def test_usage_periods_outside_the_calendar_are_422_naming_period(pg):
    org = pg.new_org()
    for period in ("9999-12", "0001-01", "2026-13"):
        response = pg.client.get("/v1/usage", params={"period": period}, headers=org.headers)
        assert response.status_code == 422 and field_of(response) == "period", (period, response.text)
    assert pg.client.get("/v1/usage", params={"period": "9999-11"}, headers=org.headers).status_code == 200


def test_sse_cursors_beyond_the_last_event_are_refused_naming_the_header(pg):
    org = pg.new_org()
    running = pg.create_job(org)["id"]
    pg.runner.run_stage(running, finish=False)
    finished = pg.create_job(org)["id"]
    pg.runner.run_to_end(finished)
    stream = {**org.headers, "Accept": "text/event-stream"}
    for job_id in (running, finished):
        for cursor in ("2147483648", str(2**62), "999"):
            response = pg.client.get(f"/v1/jobs/{job_id}/events", headers={**stream, "Last-Event-ID": cursor})
            assert response.status_code == 422 and field_of(response) == "Last-Event-ID", (job_id, cursor)
            assert "beyond this job's latest event" in response.text
        response = pg.client.get(f"/v1/jobs/{job_id}/events", params={"after": 2147483648}, headers=stream)
        assert response.status_code == 422 and field_of(response) == "after"
        # A page beyond the end is just empty: pollers keep their cursor.
        page = pg.client.get(f"/v1/jobs/{job_id}/events", params={"after": 2147483648}, headers=org.headers)
        assert page.status_code == 200 and page.json()["data"] == [] and page.json()["next_cursor"] is None
    latest = pg.client.get(f"/v1/jobs/{finished}/events", params={"limit": 1000}, headers=org.headers).json()
    last_id = str(latest["data"][-1]["id"])
    assert pg.client.get(f"/v1/jobs/{finished}/events", headers={**stream, "Last-Event-ID": last_id}).status_code == 204


def test_a_symbolic_link_loop_is_refused_by_estimate_and_submit(pg, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "loop").symlink_to(models / "loop")
    cycle = models / "cycle"
    cycle.mkdir()
    (cycle / "up").symlink_to(models)
    org = pg.new_org()
    for uri in (f"file://{models}/loop", f"file://{cycle}"):
        for path in ("/v1/jobs/estimate", "/v1/jobs"):
            response = pg.client.post(path, json={"target": {"uri": uri}}, headers=org.headers)
            assert response.status_code == 422 and field_of(response) == "target.uri", (uri, path, response.text)
            assert "loop" in response.json()["errors"][0]["message"]


def test_the_api_docs_load_only_vendored_assets(pg):
    vendored = (DASHBOARD_STATIC / "VENDORED.md").read_text()
    for page, assets in (("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")), ("/redoc", ("redoc.standalone.js",))):
        html = pg.client.get(page).text
        assert not re.search(r"(src|href)=\"https?://", html), html  # no CDN, no web fonts
        for name in assets:
            assert f"/assets/{name}" in html
            served = pg.client.get(f"/assets/{name}")
            assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() in vendored, name
    assert "validatorUrl" in pg.client.get("/docs").text  # no call to validator.swagger.io either


def test_estimate_counts_an_uploaded_file_and_uploads_are_capped(pg):
    org, other = pg.new_org(), pg.new_org()
    upload = pg.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "hi"}\n' * 24)}, headers=org.headers)
    file_id = upload.json()["id"]
    estimate = pg.client.post("/v1/jobs/estimate", json={**MINIMAL, "data": {"source": file_id}}, headers=org.headers)
    assert estimate.status_code == 200 and estimate.json()["prompts"] == 24, estimate.text
    capped = pg.client.post("/v1/jobs/estimate", json={**MINIMAL, "data": {"source": file_id, "count": 10}},
                            headers=org.headers)
    assert capped.json()["prompts"] == 10
    foreign = pg.client.post("/v1/jobs/estimate", json={**MINIMAL, "data": {"source": file_id}}, headers=other.headers)
    assert foreign.status_code == 422 and field_of(foreign) == "data.source"

    before = pg.row_counts()
    huge = pg.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt":"x"}\n' * 100_001)}, headers=org.headers)
    assert huge.status_code == 422, huge.text
    error = huge.json()["errors"][0]
    assert error["field"] == "file" and error["line"] == 100_001 and "more than 100000 prompts" in error["message"]
    assert pg.row_counts() == before
    too_many = pg.client.post("/v1/jobs", json={**MINIMAL, "data": {"count": 1_000_001}}, headers=org.headers)
    assert too_many.status_code == 422 and field_of(too_many) == "data.count"
