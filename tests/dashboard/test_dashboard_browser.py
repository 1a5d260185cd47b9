"""The dashboard in real headless Chromium, against the real API served by uvicorn: sign-in, the jobs
list with filters and live updates, the new-job form (fields from the OpenAPI schema, the API's field
errors, the estimate), a job watched live through its stages (a dropped connection included), its
charts and results, downloads, cancel/resume from the keyboard, comparisons, an expired key, and
axe-core's WCAG A/AA checks on every view."""

from __future__ import annotations

import hashlib
import math
import re
from datetime import datetime

import pytest
from dashboard_browser import (
    TIMEOUT_MS,
    axe_violations,
    bar_texts,
    drawn_pixels,
    legend_text,
    overlapping,
    screenshot,
    series_labels,
    sign_in,
)
from dashboard_job_driver import inconclusive_report, sample_records, sample_report, variant_report
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
    dashboard.driver.worker_went_quiet(waiting["id"])  # the API's words for the status, not its name alone
    expect(page.locator(f'tr[data-job-id="{waiting["id"]}"] [data-status]')).to_have_text("waiting for a worker",
                                                                                          timeout=TIMEOUT_MS)
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
    expect(field).to_be_hidden()  # the drafter's section starts collapsed
    page.locator('[data-section="drafter"] > summary').click()
    page.get_by_label("Target URI").fill("bundled:smollm2-135m")
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
    page.get_by_label("Job name").fill("from the form")
    page.get_by_label("Job labels").fill("suite: dashboard")
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
    page.wait_for_selector('figure[data-chart="loss"] canvas', timeout=TIMEOUT_MS)
    assert drawn_pixels(page, "loss") > 300
    for figure in ("acceptance-by-position", "acceptance-by-category", "speedup-by-block-size"):
        expect(page.locator(f'figure[data-chart="{figure}"] .ds-bar-fill').first).to_be_visible()
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
        from domain import runs as stage_runner

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
    legend = page.locator('figure[data-chart="acceptance-by-position"] .ds-bar-legend li')
    expect(legend.first).to_be_visible(timeout=TIMEOUT_MS)
    labels = legend.all_inner_texts()
    assert any("dflash2 b8" in label for label in labels) and any("dflash b8" in label for label in labels)
    tau_bars = bar_texts(page, "tau-by-job")
    assert tau_bars == [f"{expected['tau']:.3f} · {expected['cycles']} cycles" for expected in (report, weaker)]
    screenshot(page, "compare")
    assert_accessible(page, "compare view")


def test_a_revoked_key_brings_back_the_sign_in_prompt(page, dashboard):
    key_id, key = dashboard.new_key()
    sign_in(page, key)
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    with dashboard.services.session_factory() as session:
        from domain.models import ApiKey, utcnow

        session.get(ApiKey, key_id).revoked_at = utcnow()
        session.commit()
    # The list refreshes itself; its next call is refused and the prompt replaces the page.
    expect(page.get_by_role("heading", name="Sign in to Draftsmith")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#api-key-error")).to_contain_text("unknown or revoked API key")
    assert page.evaluate("sessionStorage.length") == 0


# ---- issue 19: what a person reads on a job's page and in report.html -------------------------------------


def test_chart_legends_show_values_never_placeholders(finished_page):
    records = sample_records()
    for figure in ("loss", "position-accuracy"):
        assert "--" not in legend_text(finished_page, figure), figure
    # Off the chart: the latest value of each series. On it: the value under the cursor.
    assert f"{records[-1]['step']} (latest)" in legend_text(finished_page, "loss")
    assert f"{round(records[-1]['loss'], 4):g}" in legend_text(finished_page, "loss")
    overlay = finished_page.locator('figure[data-chart="loss"] .u-over')
    box = overlay.bounding_box()
    finished_page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hovered = legend_text(finished_page, "loss")
    step = int(re.search(r"step\s*(\d+)", hovered).group(1))
    assert f"{round(records[step - 1]['loss'], 4):g}" in hovered and "latest" not in hovered
    finished_page.mouse.move(0, 0)
    assert "--" not in finished_page.inner_text("#training") + finished_page.inner_text("#report")


def test_a_first_step_loss_spike_does_not_flatten_the_curve(finished_page):
    losses = [r["loss"] for r in sample_records()]
    y = finished_page.evaluate("""() => {
        const plot = document.querySelector('figure[data-chart="loss"] .ds-chart').plot;
        return { min: plot.scales.y.min, max: plot.scales.y.max };
    }""")
    tail = losses[len(losses) // 10:]
    assert y["max"] < max(losses) / 4  # the spike (62 at step 1) is above the axis...
    assert (max(tail) - min(tail)) / (y["max"] - y["min"]) > 0.7  # ...and the rest fills the chart
    note = finished_page.locator('figure[data-chart="loss"] .ds-chart-note')
    expect(note).to_contain_text("Y axis clipped")
    expect(note).to_contain_text(f"up to {round(max(losses), 2):g} at step 1")


def test_category_and_position_labels_never_overlap(finished_page):
    try:
        for width in (1280, 700, 380):  # two columns, one column, a phone
            finished_page.set_viewport_size({"width": width, "height": 900})
            finished_page.wait_for_timeout(100)
            for figure in ("acceptance-by-category", "acceptance-by-position", "speedup-by-block-size"):
                cells = f'figure[data-chart="{figure}"] .ds-bars > *'
                assert overlapping(finished_page, cells) == [], (width, figure)
                clipped = finished_page.eval_on_selector_all(
                    cells, "ns => ns.filter(n => n.scrollWidth > n.clientWidth + 1).map(n => n.textContent)")
                assert clipped == [], (width, figure)
        screenshot(finished_page, "job-finished-narrow")
    finally:
        finished_page.set_viewport_size({"width": 1280, "height": 900})


def test_acceptance_bars_carry_their_counts_and_few_cycles_are_greyed(finished_page):
    report = sample_report()
    positions = report["acceptance_by_position"]
    conditional = bar_texts(finished_page, "acceptance-by-position", 0)
    unconditional = bar_texts(finished_page, "acceptance-by-position", 1)
    assert conditional[5] == "1.00 (2/2)"  # position 6: a 1.0 resting on two cycles says so
    assert conditional == [f"{p['conditional']:.2f} ({p['accepted']}/{p['reached']})" for p in positions]
    assert [u.split(" ")[1] for u in unconditional] == [f"({p['accepted']}/{p['offered']})" for p in positions]
    few = finished_page.eval_on_selector_all('figure[data-chart="acceptance-by-position"] .ds-bars-cell:nth-child(3n+2) .ds-bar',
                                             "ns => ns.map(n => n.classList.contains('ds-bar-few'))")
    assert few == [p["reached"] < 20 for p in positions] and any(few) and not all(few)
    expect(finished_page.locator('figure[data-chart="acceptance-by-position"] .ds-legend-few')).to_contain_text("fewer than 20 cycles")
    categories = report["acceptance_by_category"]
    assert bar_texts(finished_page, "acceptance-by-category") == [
        f"{categories[name]['tau']:.2f} · {categories[name]['cycles']} cycles" for name in sorted(categories)]


def test_an_empty_target_reads_as_an_example_and_its_error_says_what_to_type(page, dashboard):
    """Issue 32: the placeholder was a real target (bundled:smollm2-135m), and Create answered "Field required"."""
    sign_in(page, dashboard.key, "/#/jobs/new")
    field = page.get_by_label("Target URI")
    expect(field).to_have_value("")
    expect(field).to_have_attribute("placeholder", "e.g. hf://your-org/your-model")
    jobs_before = len(dashboard.api("GET", "/v1/jobs", params={"limit": 100}).json()["data"])
    page.get_by_role("button", name="Create job").click()
    error = page.locator('[data-error-for="target.uri"]')  # at the field to type in, not on its section
    expect(error).to_contain_text("required: set target.uri")
    expect(error).to_contain_text("e.g. bundled:smollm2-135m")
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#form-errors")).to_contain_text("target: required: set target.uri")
    assert len(dashboard.api("GET", "/v1/jobs", params={"limit": 100}).json()["data"]) == jobs_before


def test_new_job_form_in_sections_with_human_labels_and_the_estimate_in_view(page, dashboard):
    schemas = dashboard.api("GET", "/openapi.json").json()["components"]["schemas"]
    sign_in(page, dashboard.key, "/#/jobs/new")
    form = page.locator("#job-form")
    expect(page.get_by_label("Target URI")).to_be_visible()
    # Every leaf of the API's job spec is a field (none hand-copied, none missing).
    def leaves(schema: dict) -> int:
        count = 0
        for prop in schema.get("properties", {}).values():
            ref = next((o.get("$ref") for o in [prop, *prop.get("anyOf", [])] if o.get("$ref")), None)
            count += leaves(schemas[ref.rsplit("/", 1)[1]]) if ref and "properties" in schemas[ref.rsplit("/", 1)[1]] else 1
        return count
    assert form.locator("[data-field] :is(input, select, textarea)").count() == leaves(schemas["JobSpec"])
    labels = form.locator("label").all_text_contents()
    assert not {"Uri", "Top p", "Top P", "Num layers"} & {label.strip(" *") for label in labels}
    assert {"Target URI", "Top-p", "Number of layers", "ZeRO stage", "Job name"} <= {label.strip(" *") for label in labels}
    sections = form.locator("details.form-section")
    titles = sections.locator("> summary .section-title").all_inner_texts()
    assert titles == ["Target", "Sampling", "Drafter", "Data", "Training", "Validation", "Compute", "Warm start", "Publish"]
    assert [s.get_attribute("open") is not None for s in sections.all()] == [t == "Target" for t in titles]
    expect(form.locator('[data-digest="training"]')).to_have_text("defaults")
    # Was one 4,600-pixel column; the open Target section holds two full-width URI rows (uri, and base for a
    # LoRA adapter target), the rest are collapsed.
    assert form.bounding_box()["height"] < 1300
    for section in sections.all():  # open every section: two columns of fields, and the estimate still in view
        if section.get_attribute("open") is None:
            section.locator("> summary").click()
    page.get_by_label("Target URI").fill("bundled:smollm2-135m")
    tops = form.locator('[data-section="training"] .field-grid > .field').evaluate_all(
        "ns => ns.map(n => Math.round(n.getBoundingClientRect().top))")
    assert len(set(tops)) < len(tops)  # fields side by side
    page.get_by_label("Max steps").fill("100")
    expect(form.locator('[data-digest="training"]')).to_have_text('changed: Max steps 100')
    expect(page.locator('[data-estimate="steps"]')).to_have_text("100")
    page.locator("#create-job").scroll_into_view_if_needed()
    estimate, viewport = page.locator("#estimate").bounding_box(), page.viewport_size
    assert 0 <= estimate["y"] and estimate["y"] + 40 < viewport["height"]
    screenshot(page, "new-job-form")
    assert_accessible(page, "new job form, every section open")


def test_eta_of_the_running_stage_and_the_whole_job(page, dashboard):
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "eta"})
    driver = dashboard.driver
    driver.quick_stage(job["id"], "prepare")
    driver.claim(job["id"], "generate")
    driver.backdate(job["id"], "generate", 600)
    driver.event(job["id"], "generated 25 %", progress=25.0)  # 25 % in 10 minutes: 30 minutes to go
    sign_in(page, dashboard.key, f"/#/jobs/{job['id']}")
    eta = page.locator('[data-stage="generate"] .stage-eta')
    expect(eta).to_contain_text("left")
    assert 1770 <= int(eta.get_attribute("data-eta")) <= 1830  # 3 x the 10 minutes (and the seconds this test took)
    # The whole job: generate's projected 40 minutes scale the API's estimate of the stages to come.
    estimate = dashboard.api("POST", "/v1/jobs/estimate", json=job["spec"]).json()["estimates"]
    best = min(estimate, key=lambda e: abs(math.log(2400 / (60 * e["generation_minutes"]))))
    factor = 2400 / (60 * best["generation_minutes"])
    train = min(60 * best["training_minutes"] * factor, 60 * job["spec"]["training"]["max_minutes"])
    prepare = next(s for s in dashboard.api("GET", f"/v1/jobs/{job['id']}").json()["stages"] if s["stage"] == "prepare")
    overhead = 60 * best["overhead_minutes"] - (datetime.fromisoformat(prepare["finished_at"])
                                                 - datetime.fromisoformat(prepare["started_at"])).total_seconds()
    expected = 1800 + train + 60 * best["validation_minutes"] * factor + max(0.0, overhead)
    whole = page.locator("#job-eta")
    expect(whole).to_contain_text("Whole job: ≈")
    assert abs(int(whole.get_attribute("data-seconds")) - expected) < 40
    whole.locator("summary").click()
    expect(whole).to_contain_text(f"estimate for {best['gpu_class']}")
    screenshot(page, "job-eta")
    page.goto("/#/jobs")
    cell = page.locator(f'tr[data-job-id="{job["id"]}"] [data-col="eta"]')
    expect(cell).to_contain_text("generate ≈")
    expect(cell).to_contain_text("whole job ≈")


def test_validation_advice_and_an_untested_sampling_check_are_said_plainly(finished_page, page, dashboard, finished_job):
    report = sample_report()
    assert report["serving_advice"]["enable"] is False
    advice = finished_page.locator("#serving-advice")
    expect(advice).to_contain_text("Do not enable this drafter on hardware like the validation machine")
    assert advice.bounding_box()["y"] < finished_page.locator("#timeline").bounding_box()["y"]  # above the rest
    expect(finished_page.locator('[data-figure="recommended"] .label')).to_have_text("best block size, if enabled elsewhere")
    expect(finished_page.locator("#serving-warning")).to_contain_text("Before you serve it: Do not enable")
    low, high = report["speedup"]["ratio_ci95"]
    expect(finished_page.locator('[data-figure="speedup"]')).to_contain_text(f"95 % interval {low:g}–{high:g}×")

    untested = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "sampling untested"})
    dashboard.driver.run_to_success(untested["id"], inconclusive_report(report))
    reason = inconclusive_report(report)["lossless"]["sampling"]["reason"]
    sign_in(page, dashboard.key, f"/#/jobs/{untested['id']}")
    sampling = page.locator('[data-figure="sampling"]')
    expect(sampling.locator(".value")).to_have_text("not tested")
    expect(sampling).to_contain_text(reason)
    cell = page.locator('#lossless-table td[data-sampling="inconclusive"]')
    expect(cell).to_contain_text(f"not tested: {reason}")
    assert page.locator("#lossless-table .ok").count() == 0  # no green "passed" anywhere in the checks
    screenshot(page, "job-sampling-untested")

    page.goto(f"/#/compare?jobs={finished_job['id']},{untested['id']}")
    banner = page.locator("#compare-advice")
    expect(banner).to_contain_text("Validation advises against serving all of these drafters")
    expect(page.locator('#compare-table [data-col="advice"]').first).to_have_text(
        "do not enable on hardware like the validation machine")


def test_tau_at_t0_and_at_the_jobs_temperature_show_with_their_intervals(page, dashboard):
    report = sample_report()  # a report.json of today adds both figures (trainer/validation/sampled_acceptance.py)
    common = {"prompts": 12, "block_size": report["block_size"], "seed": 0}
    greedy = {**common, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "tau": report["tau"], "ci95": [1.1861, 1.2544],
              "tokens": 701, "cycles": 575}
    sampled = {**common, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "tau": 1.1532, "ci95": [1.1013, 1.2087],
               "tokens": 668, "cycles": 579, "same_as_greedy": False}
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "tau at two temperatures"})
    dashboard.driver.run_to_success(job["id"], {**report, "tau_greedy": greedy, "tau_sampled": sampled})
    sign_in(page, dashboard.key, f"/#/jobs/{job['id']}")
    at_zero = page.locator('[data-figure="tau-greedy"]')
    expect(at_zero.locator(".value")).to_have_text(f"{round(greedy['tau'], 3):g}")
    expect(at_zero).to_contain_text("95 % interval 1.186–1.254, 12 prompts, 701 tokens")
    at_job = page.locator('[data-figure="tau-sampled"]')
    expect(at_job.locator(".label")).to_have_text("τ at the job's T=0.7")
    expect(at_job.locator(".value")).to_have_text("1.153")
    expect(at_job).to_contain_text("speculative sampling, top-p 0.9, top-k 40; 95 % interval 1.101–1.209")
    assert_accessible(page, "a report with both acceptance figures")

    greedy_job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "greedy job"})
    same = {**greedy, "same_as_greedy": True}
    dashboard.driver.run_to_success(greedy_job["id"], {**report, "tau_greedy": greedy, "tau_sampled": same})
    page.goto(f"/#/jobs/{greedy_job['id']}")
    expect(page.locator('[data-figure="tau-sampled"]')).to_contain_text("the job is greedy: the T=0 figure")
    expect(page.locator('[data-figure="tau-sampled"] .label')).to_have_text("τ at the job's T=0")


def test_a_warm_starts_parent_and_new_tau_show_with_the_advice_to_keep_the_parent(page, dashboard):
    report = sample_report()
    figure = {"prompts": 12, "block_size": report["block_size"], "seed": 0, "tokens": 700, "cycles": 560}
    warm_start = {
        "prompts": 12, "parent_tau": 1.25, "tau": 1.3, "gain_over_parent": 0.05, "advice": "keep_parent",
        "advice_reason": "keep serving the parent: the gain's 95 % interval does not lie above 1 (tau 1.300 vs the "
                         "parent's 1.250 at T=0.7, ratio 1.040 [0.980, 1.100] over 12 held-out prompts)",
        "parent_tau_greedy": {**figure, "temperature": 0.0, "tau": 1.2, "ci95": [1.1, 1.3]},
        "tau_greedy": {**figure, "temperature": 0.0, "tau": 1.28, "ci95": [1.2, 1.35]},
        "parent_tau_sampled": {**figure, "temperature": 0.7, "tau": 1.25, "ci95": [1.15, 1.33], "same_as_greedy": False},
        "tau_sampled": {**figure, "temperature": 0.7, "tau": 1.3, "ci95": [1.2, 1.4], "same_as_greedy": False},
        "gain_greedy": {"temperature": 0.0, "ratio": 1.0667, "ci95": [0.99, 1.12], "prompts": 12},
        "gain_sampled": {"temperature": 0.7, "ratio": 1.04, "ci95": [0.98, 1.1], "prompts": 12},
        "parent": {"name": "hf://z-lab/smollm2-dflash", "format": "z-lab", "variant": "dflash",
                   "upgrades": ["DFlash to DFlash 2"]},
        "adapter": {"rank": 8, "alpha": 16.0, "trainable_parameters": 204288, "drafter_parameters": 33731200,
                    "trainable_share": 0.006056, "bytes": 820000, "drafter_bytes": 134930000,
                    "folder": "drafter-adapter"},
    }
    mode = {"enable_thinking": False, "has_system_prompt": True, "system_prompt_sha256": "ab12cd34" + "0" * 56,
            "temperature": 0.7, "top_p": 0.9, "top_k": 0}
    job = dashboard.create_job({"target": {"uri": "bundled:smollm2-135m"}, "name": "a specialisation"})
    dashboard.driver.run_to_success(job["id"], {**report, "serving_mode": mode,
                                                "warm_start": {**warm_start, "serving_mode": mode}})
    sign_in(page, dashboard.key, f"/#/jobs/{job['id']}")
    banner = page.locator("#warm-start-advice")
    expect(banner).to_have_attribute("data-advice", "keep_parent")
    expect(banner).to_contain_text("Warm start: Keep serving the parent: the gain's 95 % interval does not lie above 1")
    rows = page.locator("#warm-start-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("T=0 (greedy)")
    expect(rows.nth(0).locator("[data-parent-tau]")).to_have_text("1.2 [1.1, 1.3]")
    expect(rows.nth(1).locator("[data-new-tau]")).to_have_text("1.3 [1.2, 1.4]")
    expect(rows.nth(1).locator("[data-ratio]")).to_have_text("1.04× [0.98, 1.1]")
    expect(page.locator("#warm-start-parent")).to_contain_text("hf://z-lab/smollm2-dflash, z-lab format, dflash")
    expect(page.locator("#warm-start-adapter")).to_contain_text(
        "a rank-8 LoRA, alpha 16, 204,288 parameters (0.606 % of the drafter's 33,731,200)")
    expect(page.locator("#serving-mode")).to_contain_text("thinking off, system prompt ab12cd34, T=0.7, top-p 0.9")
    assert_accessible(page, "a warm start's before and after")
