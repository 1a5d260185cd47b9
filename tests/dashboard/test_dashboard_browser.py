"""The dashboard in real headless Chromium, against the real API served by uvicorn: sign-in, the jobs
list with filters and live updates, the new-job form (fields from the OpenAPI schema, the API's field
errors, the estimate), a job watched live through its stages (a dropped connection included), its
charts and results, downloads, cancel/resume from the keyboard, comparisons, an expired key, and
axe-core's WCAG A/AA checks on every view."""

from __future__ import annotations

import hashlib
import re

import pytest
from dashboard_browser import TIMEOUT_MS, axe_violations, drawn_pixels, screenshot, series_labels, sign_in
from dashboard_job_driver import sample_records, sample_report, variant_report
from playwright.sync_api import expect

pytestmark = pytest.mark.slow


def assert_accessible(page, view: str) -> None:  # noqa: ANN001
    violations = axe_violations(page)
    assert violations == [], f"axe-core found WCAG A/AA violations on the {view}: {violations}"


def event_ids_on_page(page) -> list[int]:  # noqa: ANN001
    return page.eval_on_selector_all("#event-log tbody tr", "rows => rows.map(r => Number(r.dataset.eventId))")


def test_sign_in_prompt_refuses_a_wrong_key_with_the_apis_reason(page, dashboard):
    page.goto("/")
    expect(page.get_by_role("heading", name="Sign in to Draftsmith")).to_be_visible()
    assert_accessible(page, "sign-in prompt")
    wrong = dashboard.api("GET", "/v1/jobs", headers={"Authorization": "Bearer dsk_not_a_real_key"}).json()
    page.get_by_label("API key").fill("dsk_not_a_real_key")
    page.get_by_label("API key").press("Enter")  # the keyboard submits the form
    expect(page.locator("#api-key-error")).to_contain_text(wrong["detail"])
    expect(page.get_by_label("API key")).to_be_visible()
    sign_in(page, dashboard.key)
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()


def test_jobs_list_filters_by_status_and_label_and_updates_live(page, dashboard):
    report = sample_report()
    done = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "main recipe",
                                 "labels": {"team": "search"}})
    dashboard.driver.run_to_success(done["id"], report)
    broken = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "drafter": {"block_size": 4}})
    dashboard.driver.fail(broken["id"], "prepare", "the worker lost the target")
    waiting = dashboard.create_job()
    sign_in(page, dashboard.key)

    row = page.locator(f'tr[data-job-id="{done["id"]}"]')
    expect(row).to_contain_text("main recipe")
    expect(row.locator("[data-status]")).to_have_text("succeeded")
    expect(row).to_contain_text("bundled:smollm2-135m")
    expect(row.locator('[data-col="tau"]')).to_have_text(f"{round(report['tau'], 3):g}")
    expect(row.locator('[data-col="speedup"]')).to_have_text(f"{round(report['speedup']['ratio'], 2):g}×")
    expect(page.locator(f'tr[data-job-id="{broken["id"]}"] td').nth(5)).to_have_text("4")
    screenshot(page, "jobs-list")
    assert_accessible(page, "jobs list")

    # Live: a job created elsewhere and a status change appear without reloading the page.
    page.evaluate("window.__sameDocument = true")
    dashboard.driver.claim(waiting["id"], "prepare")
    expect(page.locator(f'tr[data-job-id="{waiting["id"]}"] [data-status]')).to_have_text("preparing", timeout=TIMEOUT_MS)
    fresh = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "made by the CLI"})
    expect(page.locator(f'tr[data-job-id="{fresh["id"]}"]')).to_contain_text("made by the CLI", timeout=TIMEOUT_MS)
    assert page.evaluate("window.__sameDocument") is True

    page.get_by_label("Status").select_option("failed")
    expect(page).to_have_url(re.compile(r"#/jobs\?status=failed$"))
    expect(page.locator("#jobs-table tbody tr")).to_have_count(1)
    expect(page.locator(f'tr[data-job-id="{broken["id"]}"]')).to_be_visible()

    page.get_by_label("Status").select_option("")
    page.get_by_label("Labels").fill("team:search")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("#jobs-table tbody tr")).to_have_count(1)
    expect(page.locator(f'tr[data-job-id="{done["id"]}"]')).to_be_visible()
    page.get_by_label("Labels").fill("not-a-filter")
    page.get_by_role("button", name="Apply filters").click()
    api_error = dashboard.api("GET", "/v1/jobs", params={"label": "not-a-filter"}).json()
    expect(page.locator("#filter-error")).to_contain_text(api_error["errors"][0]["message"])


def test_new_job_form_uses_the_schema_shows_api_errors_and_the_estimate(page, dashboard):
    schema = dashboard.api("GET", "/openapi.json").json()["components"]["schemas"]
    block = schema["DrafterSpec"]["properties"]["block_size"]
    sign_in(page, dashboard.key)
    page.get_by_role("link", name="New job").first.click()

    field = page.get_by_label("Block size")
    expect(field).to_have_value(str(block["default"]))
    expect(page.locator('[data-field="drafter.block_size"] .help')).to_contain_text(block["description"])
    page.get_by_label("Uri").fill("bundled:smollm2-135m")
    estimate = dashboard.api("POST", "/v1/jobs/estimate", json={"target": {"uri": "bundled:smollm2-135m"}}).json()
    expect(page.locator('[data-estimate="tokens"]')).to_have_text(f"{estimate['tokens_to_generate']:,}")
    expect(page.locator("#estimate-table tbody tr")).to_have_count(len(estimate["estimates"]))

    # Bad input: the API's own message, next to the field, before and after pressing Create.
    body = {"target": {"uri": "bundled:smollm2-135m"}, "drafter": {"block_size": 99}}
    message = dashboard.api("POST", "/v1/jobs", json=body).json()["errors"][0]["message"]
    jobs_before = len(dashboard.api("GET", "/v1/jobs", params={"limit": 100}).json()["data"])
    field.fill("99")
    error = page.locator('[data-error-for="drafter.block_size"]')
    expect(error).to_have_text(message)
    page.get_by_role("button", name="Create job").click()
    expect(error).to_have_text(message)
    expect(field).to_have_attribute("aria-invalid", "true")
    assert error.get_attribute("id") in field.get_attribute("aria-describedby").split()
    expect(page.locator("#form-errors")).to_contain_text("shown next to its field")
    assert len(dashboard.api("GET", "/v1/jobs", params={"limit": 100}).json()["data"]) == jobs_before
    screenshot(page, "new-job-form-error")
    assert_accessible(page, "new job form with a field error")

    field.fill("4")
    expect(error).to_have_text("")
    page.get_by_label("Name", exact=True).fill("from the form")
    page.get_by_label("Labels").fill("suite: dashboard")
    page.get_by_role("button", name="Create job").click()
    expect(page).to_have_url(re.compile(r"#/jobs/job_[0-9A-Z]{26}$"))
    job_id = page.url.rsplit("/", 1)[1]
    job = dashboard.api("GET", f"/v1/jobs/{job_id}").json()
    assert job["spec"]["drafter"]["block_size"] == 4 and job["labels"] == {"suite": "dashboard"}
    assert job["name"] == "from the form"

    # Its stage changes while the page watches (no reload).
    expect(page.locator("#job-status [data-status]")).to_have_text("queued")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    page.evaluate("window.__sameDocument = true")
    dashboard.driver.claim(job_id, "prepare")
    expect(page.locator("#job-status [data-status]")).to_have_text("preparing", timeout=TIMEOUT_MS)
    expect(page.locator('[data-stage="prepare"]')).to_have_attribute("data-state", "running")
    dashboard.driver.finish(job_id, "prepare")
    dashboard.driver.claim(job_id, "generate")
    expect(page.locator("#job-status [data-status]")).to_have_text("generating", timeout=TIMEOUT_MS)
    expect(page.locator('[data-stage="prepare"]')).to_have_attribute("data-state", "succeeded")
    assert page.evaluate("window.__sameDocument") is True


def test_job_page_live_through_a_dropped_connection_to_charts_and_downloads(page, dashboard):
    report, records = sample_report(), sample_records()
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "watched live"})
    job_id, driver = job["id"], dashboard.driver
    driver.quick_stage(job_id, "prepare")
    driver.quick_stage(job_id, "generate")
    driver.train(job_id, records[: len(records) // 2], finish=False)
    sign_in(page, dashboard.key, f"/#/jobs/{job_id}")

    expect(page.locator("#job-status [data-status]")).to_have_text("training")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    expect(page.locator('[data-stage="train"] progress')).to_be_visible()
    # wait_for_selector, not wait_for_function: the page's policy forbids the eval the latter needs.
    page.wait_for_selector('figure[data-chart="loss"] canvas', timeout=TIMEOUT_MS)
    assert drawn_pixels(page, "loss") > 500
    assert drawn_pixels(page, "position-accuracy") > 500
    positions = len(records[0]["accuracy_per_position"])
    assert series_labels(page, "position-accuracy") == [f"position {k}" for k in range(1, positions + 1)]
    driver.event(job_id, "gradient norm spiked to 40.2", level="warning")
    warning = page.locator('#event-log tr[data-level="warning"]')
    expect(warning).to_contain_text("gradient norm spiked to 40.2")
    expect(warning.locator(".level")).to_have_text("warning")
    page.get_by_label("Show").select_option("warning")  # the log's level filter
    expect(page.locator('#event-log tr[data-level="info"]').first).to_be_hidden()
    expect(warning).to_be_visible()
    page.get_by_label("Show").select_option("info")
    screenshot(page, "job-running")
    assert_accessible(page, "running job")

    # The connection drops: the page says so, then resumes after the last event it had, once each.
    last_seen = max(event_ids_on_page(page))
    dashboard.proxy.cut(pause=True)
    expect(page.locator("#live-state")).to_have_attribute("data-state", "reconnecting", timeout=TIMEOUT_MS)
    expect(page.locator("#live-state")).to_contain_text("Connection lost")
    screenshot(page, "job-reconnecting")
    driver.finish(job_id, "train")
    driver.validate(job_id, report)
    dashboard.proxy.resume()
    expect(page.locator('[data-stage="validate"]')).to_have_attribute("data-state", "succeeded", timeout=3 * TIMEOUT_MS)
    expect(page.locator("#live-state")).to_have_attribute("data-state", "live")
    resumed = [head for head in dashboard.proxy.request_heads(rf"/v1/jobs/{job_id}/events")
               if "last-event-id" in head]
    assert resumed and resumed[0]["last-event-id"] == str(last_seen)
    api_ids = [e["id"] for e in dashboard.api("GET", f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]]
    expect(page.locator("#event-log tbody tr")).to_have_count(len(api_ids))
    assert event_ids_on_page(page) == api_ids  # every event once, in order, none missing after the gap

    # Finished: validation results, charts, serving commands, artifacts.
    driver.export(job_id, report, records)
    driver.quick_stage(job_id, "publish")
    expect(page.locator("#job-status [data-status]")).to_have_text("succeeded", timeout=TIMEOUT_MS)
    expect(page.locator("#live-state")).to_have_attribute("data-state", "ended")
    expect(page.locator('[data-figure="tau"] .value')).to_have_text(f"{round(report['tau'], 3):g}")
    headroom = round(report["oracle_tau"] - report["tau"], 3)
    expect(page.locator('[data-figure="oracle"]')).to_contain_text(f"headroom +{headroom:g}")
    expect(page.locator('[data-figure="recommended"] .value')).to_have_text(str(report["recommended_block_size"]))
    expect(page.locator('[data-figure="speedup"] .value')).to_have_text(f"{round(report['speedup']['ratio'], 3):g}×")
    greedy = report["lossless"]["greedy"]
    expect(page.locator("#lossless-table")).to_contain_text(
        f"{greedy['mismatches']} mismatches over {greedy['prompts']} prompts")
    for figure in ("acceptance-by-position", "acceptance-by-category", "speedup-by-block-size", "loss"):
        page.wait_for_selector(f'figure[data-chart="{figure}"] canvas', timeout=TIMEOUT_MS)
        assert drawn_pixels(page, figure) > 300, figure
    categories = sorted(report["acceptance_by_category"])
    category_rows = page.locator('figure[data-chart="acceptance-by-category"] .ds-data-table tbody tr')
    expect(category_rows).to_have_count(len(categories))
    sglang = page.locator('[data-command="SGLang"]')
    expect(sglang).to_contain_text(f"--speculative-num-draft-tokens {report['recommended_block_size']}")
    sglang.get_by_role("button").click()
    expect(page.locator("#notice")).to_contain_text("SGLang command copied")
    assert page.evaluate("navigator.clipboard.readText()") == sglang.locator("code").inner_text()
    screenshot(page, "job-finished")
    assert_accessible(page, "finished job")

    artifacts = {a["name"]: a for a in dashboard.api("GET", f"/v1/jobs/{job_id}/artifacts").json()["data"]}
    for name in ("drafter/model.safetensors", "report.json"):
        row = page.locator(f'tr[data-artifact="{name}"]')
        expect(row.locator("[data-sha256]")).to_have_attribute("data-sha256", artifacts[name]["sha256"])
        with page.expect_download() as download_info:
            row.get_by_role("button", name=f"Download {name}").click()
        data = open(download_info.value.path(), "rb").read()
        assert hashlib.sha256(data).hexdigest() == artifacts[name]["sha256"]
        assert data == driver.stored[f"{job_id}/{name}"]
        assert download_info.value.suggested_filename == name.rsplit("/", 1)[-1]


def test_cancel_and_resume_from_the_keyboard(page, dashboard):
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "to cancel"})
    dashboard.driver.claim(job["id"], "prepare")
    sign_in(page, dashboard.key, f"/#/jobs/{job['id']}")
    cancel = page.get_by_role("button", name="Cancel job")
    cancel.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#job-status [data-status]")).to_have_text("cancelling", timeout=TIMEOUT_MS)
    with dashboard.services.session_factory() as session:  # the worker stops at a safe point
        from api import stage_runner

        stage_runner.acknowledge_cancellation(session, job["id"])
    expect(page.locator("#job-status [data-status]")).to_have_text("cancelled", timeout=TIMEOUT_MS)
    resume = page.get_by_role("button", name="Resume job")
    resume.focus()
    page.keyboard.press("Space")
    expect(page.locator("#job-status [data-status]")).to_have_text("queued", timeout=TIMEOUT_MS)
    assert dashboard.api("GET", f"/v1/jobs/{job['id']}").json()["resume_count"] == 1


def test_compare_two_drafters_side_by_side(page, dashboard):
    report = sample_report()
    weaker = variant_report(report, scale=0.6, variant_note="test double: DFlash acceptances at 0.6x")
    dflash2 = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "dflash2 b8"})
    dflash1 = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "dflash b8",
                                    "drafter": {"variant": "dflash"}})
    dashboard.driver.run_to_success(dflash2["id"], report)
    dashboard.driver.run_to_success(dflash1["id"], weaker)
    sign_in(page, dashboard.key)
    page.get_by_label(f"Compare {dflash2['name']}").check()
    page.get_by_label(f"Compare {dflash1['name']}").check()
    page.get_by_role("button", name="Compare selected (2)").click()

    expect(page).to_have_url(re.compile(r"#/compare\?jobs="))
    for job, expected in ((dflash2, report), (dflash1, weaker)):
        tau_cell = page.locator(f'#compare-table tr[data-job-id="{job["id"]}"] [data-col="tau"]')
        expect(tau_cell).to_have_text(f"{round(expected['tau'], 3):g}")
    page.wait_for_selector('figure[data-chart="acceptance-by-position"] canvas', timeout=TIMEOUT_MS)
    labels = series_labels(page, "acceptance-by-position")
    assert len(labels) == 2
    assert any("dflash2 b8" in label for label in labels) and any("dflash b8" in label for label in labels)
    assert drawn_pixels(page, "acceptance-by-position") > 200
    assert drawn_pixels(page, "tau-by-job") > 200
    screenshot(page, "compare")
    assert_accessible(page, "compare view")


def test_a_revoked_key_brings_back_the_sign_in_prompt(page, dashboard):
    key_id, key = dashboard.new_key()
    sign_in(page, key)
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    with dashboard.services.session_factory() as session:
        from api.models import ApiKey, utcnow

        session.get(ApiKey, key_id).revoked_at = utcnow()
        session.commit()
    # The list refreshes itself; its next call is refused and the prompt replaces the page.
    expect(page.get_by_role("heading", name="Sign in to Draftsmith")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#api-key-error")).to_contain_text("unknown or revoked API key")
    assert page.evaluate("sessionStorage.length") == 0
