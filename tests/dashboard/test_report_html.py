"""report.html: written by `draftsmith export` beside report.json, listed in the manifest, printed by the
CLI, self-contained (the chart library and data inline, no network), tolerant of reports with missing
or extra keys, and drawn by headless Chromium from disk with its charts (data/sample_job: the main
job's published figures)."""

from __future__ import annotations

import html
import json
import math
import re

import pytest
from dashboard_browser import OUTPUT_DIR, SAVED, bar_texts, drawn_pixels, legend_text, overlapping
from dashboard_job_driver import SAMPLE_JOB, inconclusive_report, sample_report

from report.html import MAX_METRIC_RECORDS, read_metric_records, render_report_html
from trainer.export.artifacts import write_report_html

LINE_CHARTS = ("loss", "position-accuracy")
BAR_CHARTS = ("acceptance-by-position", "acceptance-by-category", "speedup-by-block-size")


def inline_data(page_html: str) -> dict:
    match = re.search(r'<script type="application/json" id="ds-report-data">(.*?)</script>', page_html, re.DOTALL)
    assert match, "no inline data block"
    return json.loads(match.group(1))


def test_the_page_is_self_contained():
    report = sample_report()
    page = render_report_html(report, read_metric_records(SAMPLE_JOB / "metrics.jsonl"))
    # No address anywhere that a browser would fetch: no src/href/url() at all, a policy forbidding them.
    assert not re.search(r'\s(?:src|href)\s*=', page, re.IGNORECASE)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", page)
    assert "default-src 'none'" in page
    assert "uPlot" in page and "DraftsmithCharts" in page
    data = inline_data(page)
    assert data["report"]["tau"] == report["tau"]
    last = json.loads((SAMPLE_JOB / "metrics.jsonl").read_text().splitlines()[-1])
    assert data["metrics"][-1]["step"] == last["step"] and data["metrics"][-1]["loss"] == last["loss"]
    assert f">{round(report['tau'], 3):g}<" in page  # the headline reads without JavaScript


@pytest.mark.parametrize("report", [None, {}, {"tau": 1.5}, {"lossless": "unexpected shape", "speedup": 2.0},
                                    {"tau": 1.4, "d2t": {"size": 32000}, "draft_cost_ms": 1.2}])
def test_missing_odd_or_new_keys_render_rather_than_fail(report, tmp_path):
    path = write_report_html(tmp_path, report, None)
    page = path.read_text()
    assert "<html" in page and inline_data(page)["metrics"] == []
    if report and "tau" in report:
        assert f">{report['tau']:g}<" in page


def test_values_cannot_break_out_of_the_page_and_nan_becomes_null(tmp_path):
    report = {**sample_report(), "acceptance_by_category": {"</script><script>alert(1)</script>": {"tau": 1.2}},
              "oracle_tau": math.nan}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": math.nan}) + "\n" + '{"step": 2, "lo')
    page = write_report_html(tmp_path, report, metrics).read_text()
    assert "<script>alert(1)" not in page
    data = inline_data(page)
    assert "</script><script>alert(1)</script>" in data["report"]["acceptance_by_category"]
    assert data["report"]["oracle_tau"] is None and data["metrics"] == [{"step": 1, "loss": None}]


def test_long_runs_are_strided_to_a_bounded_size(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1 / s, "lr": 1e-3}) + "\n" for s in range(1, 2501)))
    records = read_metric_records(metrics)
    assert len(records) <= MAX_METRIC_RECORDS + 1
    assert records[0]["step"] == 1 and records[-1]["step"] == 2500
    assert "lr" not in records[0]  # only what the charts draw


@pytest.mark.slow
def test_export_writes_report_html_into_the_manifest_and_the_cli_prints_it(tmp_path):
    from click.testing import CliRunner
    from drafters import random_drafter
    from tiny_targets import make_bpe_target

    from draftsmith.cli import main as cli
    from trainer.drafter.checkpoint import save_drafter
    from trainer.export.artifacts import sha256_file, verify_manifest
    from trainer.targets import load_target

    target_dir = make_bpe_target(tmp_path / "target", num_layers=4)
    drafter = random_drafter(load_target(target_dir), block_size=4, num_layers=1)
    save_drafter(drafter, tmp_path / "drafter")
    (tmp_path / "report.json").write_text((SAMPLE_JOB / "report.json").read_text())
    out = tmp_path / "artifacts"
    result = CliRunner().invoke(cli, ["export", "--target", str(target_dir), "--drafter", str(tmp_path / "drafter"),
                                      "--report", str(tmp_path / "report.json"),
                                      "--metrics", str(SAMPLE_JOB / "metrics.jsonl"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].endswith(str(out / "report.html"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["report.html"]["sha256"] == sha256_file(out / "report.html")
    assert verify_manifest(out) == []
    assert inline_data((out / "report.html").read_text())["report"] == json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_report_html_opens_from_disk_offline_with_its_charts_drawn(chromium):
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = write_report_html(OUTPUT_DIR, sample_report(), SAMPLE_JOB / "metrics.jsonl",
                             title="Draftsmith drafter for smollm2-135m")
    SAVED.append(path)
    context = chromium.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    requests, problems = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-charts=drawn]", timeout=15_000)
    for figure in LINE_CHARTS:
        assert drawn_pixels(page, figure) > 300, figure
        assert "--" not in legend_text(page, figure) and "(latest)" in legend_text(page, figure), figure
    report = sample_report()
    assert page.inner_text('[data-figure="τ (mean acceptance length)"]') == f"{round(report['tau'], 3):g}"
    # The same charts as the dashboard: the loss axis clipped above the first step's spike, bars with counts
    # whose labels never overlap, and validation's advice against serving said first.
    assert "Y axis clipped" in page.inner_text('figure[data-chart="loss"] .ds-chart-note')
    positions = report["acceptance_by_position"]
    assert bar_texts(page, "acceptance-by-position") == [
        f"{p['conditional']:.2f} ({p['accepted']}/{p['reached']})" for p in positions]
    for figure in BAR_CHARTS:
        assert overlapping(page, f'figure[data-chart="{figure}"] .ds-bars > *') == [], figure
    advice = page.locator("#serving-advice")
    assert advice.get_attribute("data-enable") == "false"
    assert "Do not enable this drafter on hardware like the validation machine" in advice.inner_text()
    assert advice.bounding_box()["y"] < page.locator(".cards").bounding_box()["y"]
    shot = OUTPUT_DIR / "report-html.png"
    page.screenshot(path=str(shot), full_page=True)
    SAVED.append(shot)
    context.close()
    assert requests == [path.as_uri()] and problems == []


def test_an_untested_sampling_check_reads_not_tested_never_passed():
    report = inconclusive_report(sample_report())
    reason = report["lossless"]["sampling"]["reason"]
    page = render_report_html(report, [])
    sampling_card = re.search(r'data-figure="sampling test">(.*?)</div><div class="sub">(.*?)</div>', page, re.DOTALL)
    assert "not tested" in sampling_card.group(1) and reason in html.unescape(sampling_card.group(2))
    row = re.search(r'<th scope="row">sampling test</th><td>(.*?)</td>', page, re.DOTALL).group(1)
    assert "not tested" in row and 'class="ok"' not in row and reason in html.unescape(row)
    verdict = re.search(r'<th scope="row">verdict</th><td>(.*?)</td>', page, re.DOTALL).group(1)
    assert "greedy exact match only" in verdict and 'class="ok"' not in verdict
    # An older report (no status) keeps its verdict; one advised for gets no alarm.
    older = sample_report()
    del older["lossless"]["sampling"]["status"]
    older["serving_advice"] = {"enable": True, "summary": "enable at block size 3: 1.4x the target alone"}
    page = render_report_html(older, [])
    assert '<span class="ok">passed</span>: p = 0.21' in page
    assert 'class="advice advice-ok"' in page and 'class="advice advice-bad"' not in page
