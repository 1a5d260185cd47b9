"""report.html: the validation report and the training curves as one page that opens from disk.

`trainer/export/artifacts.py` writes it beside report.json. Everything it needs is inside the file: the chart
library (uPlot) and the chart code are inlined from `report/static/` (one copy, shared with the web dashboard; see
the README there), the data is an inline JSON block, and a Content-Security-Policy forbids any network access, so
the page renders the same offline, from an e-mail attachment or from object storage.

The headline figures are written as HTML here, so they read without JavaScript; the script only draws the charts.
The report is read through its model (schemas/validation_report.py): report.json gains keys over time (and older
ones lack some), so every figure is optional and a missing one shows as "–", never as an error.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from report.engine_figures import engine_html
from report.warm_start import adapter_text, advice_text, before_after_rows, parent_text
from schemas.validation_report import SamplingTest, ValidationReport

MAX_METRIC_RECORDS = 1000  # enough points for a smooth curve; a 100k-step run stays a small file
_METRIC_KEYS = ("step", "loss", "ce", "accuracy_per_position", "train_tau_estimate")
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def static_text(name: str) -> str:
    """A file of report/static/ (the chart code and uPlot) as text, checked to be inlinable."""
    text = (resources.files("report") / "static" / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():  # would end the inline element early
        raise ValueError(f"report/static/{name} cannot be inlined: it contains a closing script/style tag")
    return text


def _finite(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities (a diverged loss, an undefined p-value) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def read_metric_records(path: str | Path | None, limit: int = MAX_METRIC_RECORDS) -> list[dict]:
    """The curves' inputs from metrics.jsonl: evenly strided down to `limit` records, the last kept."""
    if path is None or not Path(path).is_file():
        return []
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of an interrupted run: the curve simply ends earlier
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append({key: record[key] for key in _METRIC_KEYS if key in record})
    if len(records) > limit:
        stride = math.ceil(len(records) / limit)
        records = records[::stride] + ([records[-1]] if (len(records) - 1) % stride else [])
    return records


def _num(value: Any, digits: int = 3, suffix: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    return f"{round(value, digits):g}{suffix}"


def _e(value: Any) -> str:
    return html.escape("–" if value is None else str(value))


def _verdict(passed: Any) -> str:
    if passed is True:
        return '<span class="ok">passed</span>'
    if passed is False:
        return '<span class="bad">FAILED</span>'
    return "–"


def _sampling_card(sampling: SamplingTest) -> tuple[str, str]:
    if sampling.verdict() == "inconclusive":  # never a pass: it tested nothing
        return '<span class="warn">not tested</span>', _e(sampling.reason or "the test could test nothing")
    return f"p = {_num(sampling.p_value, 4)}", f"{_e(sampling.draws)} draws, α = {_e(sampling.alpha)}"


def _sampling_row(sampling: SamplingTest) -> str:
    status = sampling.verdict()
    if status == "inconclusive":
        return f'<span class="warn">not tested</span>: {_e(sampling.reason or "the test could test nothing")}'
    verdict = _verdict({"passed": True, "failed": False}.get(status))
    return (f"{verdict}: p = {_num(sampling.p_value, 4)} (α {_e(sampling.alpha)}, "
            f"{_e(sampling.draws)} draws, {_e(sampling.cells)} cells, T = {_e(sampling.temperature)})")


def _overall_verdict(report: ValidationReport) -> str:
    if report.passed is True and report.sampling.verdict() == "inconclusive":
        return '<span class="warn">passed on the greedy exact match only</span> (the sampling test tested nothing)'
    return _verdict(report.passed)


def _advice(report: ValidationReport) -> str:
    """Validation's verdict on serving (serving_advice), as a banner above everything else."""
    advice = report.serving_advice
    summary = str((advice.summary if advice else None) or "").strip()
    if not summary:
        return ""
    kind = {True: "ok", False: "bad"}.get(advice.enable, "warn")
    text = summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")
    return (f'<div class="advice advice-{kind}" id="serving-advice" data-enable="{_e(json.dumps(advice.enable))}">'
            f"<strong>Serving advice from validation:</strong> {_e(text)}</div>")


def _warm_start_advice(report: ValidationReport) -> str:
    """A warm start's verdict on which drafter to serve (report.json `warm_start.advice`), as a banner beside
    validation's own: keep serving the parent unless the paired gain's interval lies above 1."""
    warm_start = report.warm_start
    if warm_start is None or not advice_text(warm_start):
        return ""
    text = advice_text(warm_start)
    kind = "warn" if warm_start.keep_parent else "ok"
    return (f'<div class="advice advice-{kind}" id="warm-start-advice" data-advice="{_e(warm_start.advice)}">'
            f"<strong>Warm start:</strong> {_e(text)}</div>")


def _warm_start_section(report: ValidationReport) -> str:
    """The parent against this drafter on the same held-out prompts, in the same serving mode: each one's tau with
    its 95 % interval and the paired ratio with its own, at T=0 and at the job's parameters."""
    warm_start = report.warm_start
    if warm_start is None:
        return ""
    rows = before_after_rows(warm_start)
    if not rows:  # an older report: the parent's tau alone
        rows = [("the job's parameters", _num(warm_start.parent_tau), _num(warm_start.tau), "–")]
    body = "\n".join(f"<tr><th scope=\"row\">{_e(setting)}</th><td>{_e(parent)}</td><td>{_e(new)}</td>"
                      f"<td>{_e(ratio)}</td></tr>" for setting, parent, new, ratio in rows)
    parent = parent_text(warm_start)
    facts = f"<p>Parent: {_e(parent)}.</p>" if parent else ""
    adapter = adapter_text(warm_start)
    facts += f'<p id="drafter-adapter">{_e(adapter)}</p>' if adapter else ""
    mode = warm_start.serving_mode or report.serving_mode
    measured = (f"<p>Both measured on the same {_e(warm_start.prompts)} held-out prompts and seeds, in the serving "
                f"mode: {_e(mode.summary())}.</p>" if mode is not None else "")
    return f"""<h2>Warm start: the parent against this drafter</h2>
{facts}{measured}
<table class="facts" id="warm-start"><thead><tr><th>sampling</th><th>parent τ [95 %]</th><th>this drafter τ [95 %]</th>
<th>ratio new / parent [95 %, paired]</th></tr></thead><tbody>{body}</tbody></table>"""


def _confidence_section(report: ValidationReport) -> str:
    """The drafter's calibrated confidence (report.json `confidence`) and the adaptive draft length's row."""
    confidence = report.confidence
    if confidence is None:
        return ""
    rows = [("score", _e(confidence.score)), ("positions (reached, held out)", _num(confidence.positions, 0)),
            ("AUC", _num(confidence.auc)), ("expected calibration error (held-out halves)", _num(confidence.ece)),
            ("the raw score's calibration error", _num(confidence.ece_uncalibrated))]
    row = confidence.adaptive_length
    if row is not None:
        def ratio(value, interval) -> str:
            return f"{_num(value)}× [{', '.join(_num(v) for v in interval or [])}]"

        rows += [(f"adaptive length: τ against the fixed block of {_e(row.fixed_block_size)}",
                  f"{_num(row.tau)} / {_num(row.tau_fixed)} = {ratio(row.tau_ratio, row.tau_ratio_ci95)}"),
                 ("adaptive length: tokens/s ratio (from step costs)", ratio(row.speed_ratio, row.speed_ratio_ci95)),
                 ("adaptive length: drafts verified per cycle", _num(row.mean_verified_drafts))]
    body = "\n".join(f'<tr><th scope="row">{_e(k)}</th><td>{v}</td></tr>' for k, v in rows)
    return f"""<h2>Confidence</h2>
<p>The drafter's score, calibrated to the probability that the target accepts a position (shipped in config.json
as <code>draftsmith.confidence</code>), and the draft length it drives.</p>
<table class="facts" id="confidence"><tbody>{body}</tbody></table>"""


def _serving_mode(report: ValidationReport) -> str:
    mode = report.serving_mode
    if mode is None:
        return ""
    return f'<p id="serving-mode">Every τ here was measured in the serving mode: {_e(mode.summary())}.</p>'


def _tau_cards(report: ValidationReport) -> list[tuple[str, str, str]]:
    """τ at T=0 and at the job's own sampling parameters, each with its 95 % interval (report.json `tau_greedy`,
    `tau_sampled`); an older report has neither card."""
    def interval(figure) -> str:
        low, high = (list(figure.ci95 or []) + [None, None])[:2]
        bounds = f"95 % interval {_num(low)}–{_num(high)}, " if _num(low) != "–" and _num(high) != "–" else ""
        return f"{bounds}{_e(figure.prompts)} prompts, {_e(figure.tokens)} tokens"

    cards = []
    greedy, sampled = report.tau_greedy, report.tau_sampled
    if greedy is not None:
        cards.append(("τ at T=0 (greedy)", _num(greedy.tau), interval(greedy)))
    if sampled is not None:
        sub = ("the job is greedy: the T=0 figure" if sampled.same_as_greedy else
               f"speculative sampling, top-p {_e(sampled.top_p)}, top-k {_e(sampled.top_k)}; {interval(sampled)}")
        cards.append((f"τ at the job's T={_num(sampled.temperature)}", _num(sampled.tau), sub))
    return cards


def _summary(report: ValidationReport) -> str:
    speed = report.speedup
    greedy, sampling = report.greedy, report.sampling
    recommended = report.recommended_block_size
    recommended_speedup = (report.estimated_speedup_by_block_size or {}).get(recommended)
    tau, oracle = report.tau, report.oracle_tau
    low, high = (list((speed.ratio_ci95 if speed else None) or []) + [None, None])[:2]
    interval = f", 95 % interval {_num(low, 2)}–{_num(high, 2)}×" if _num(low) != "–" and _num(high) != "–" else ""
    advised_against = report.serving_advice is not None and report.serving_advice.enable is False
    sampling_value, sampling_sub = _sampling_card(sampling)
    headroom = (f"headroom +{_num(oracle - tau)} with a perfect choice among the drafter's top-K"
                if _num(tau) != "–" and _num(oracle) != "–" else "gold token anywhere in the drafter's top-K")
    cards = [
        ("τ (mean acceptance length)", _num(tau), f"block size {_e(report.block_size)}"),
        ("oracle τ", _num(oracle), headroom),
        *_tau_cards(report),
        ("measured speedup", _num(speed.ratio if speed else None, 3, "×"),
         f"{_num(speed.ar_tokens_per_s if speed else None, 1)} → "
         f"{_num(speed.spec_tokens_per_s if speed else None, 1)} tokens/s{interval}"),
        # Advised against: the best block size is no recommendation, only the size to try elsewhere.
        ("best block size, if enabled elsewhere" if advised_against else "recommended block size", _e(recommended),
         f"draft length {_e(recommended - 1) if isinstance(recommended, int) else '–'}, "
         f"estimated {_num(recommended_speedup, 3, '×')}" + ("; not advised on this machine (above)" if advised_against else "")),
        ("greedy mismatches", _e(greedy.mismatches), f"over {_e(greedy.prompts)} prompts"),
        ("sampling test", sampling_value, sampling_sub),
    ]
    return "\n".join(
        f'<div class="card"><div class="label">{_e(label)}</div><div class="value" data-figure="{_e(label)}">'
        f'{value}</div><div class="sub">{sub}</div></div>'
        for label, value, sub in cards
    )


def _lossless(report: ValidationReport) -> str:
    greedy, sampling = report.greedy, report.sampling
    divergence = greedy.first_divergence.to_json() if greedy.first_divergence is not None else None
    rows = [
        ("verdict", _overall_verdict(report)),
        ("greedy exact match", f"{_e(greedy.mismatches)} mismatches over {_e(greedy.prompts)} prompts"),
        ("first divergence", _e(json.dumps(divergence)) if divergence else "none"),
        ("sampling test", _sampling_row(sampling)),
        ("method", _e(sampling.test)),
        ("speed measured with", _e(report.speedup.decoding if report.speedup else None)),
    ]
    return "\n".join(f"<tr><th scope=\"row\">{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1a1f24; background: #f5f6f8; }
header { background: #14324f; color: #fff; padding: 1rem 1.5rem; }
header h1 { margin: 0; font-size: 1.4rem; } header p { margin: 0.25rem 0 0; color: #dce6f0; }
main { max-width: 1100px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h2 { font-size: 1.15rem; margin: 1.5rem 0 0.75rem; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); gap: 0.75rem; }
.card { background: #fff; border: 1px solid #d0d4da; border-radius: 6px; padding: 0.75rem; }
.card .label { font-size: 0.85rem; color: #4a525c; } .card .value { font-size: 1.5rem; font-weight: 600; margin: 0.2rem 0; }
.card .sub { font-size: 0.85rem; color: #4a525c; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(420px, 100%), 1fr)); gap: 0 1rem; }
table.facts { border-collapse: collapse; background: #fff; width: 100%; }
table.facts th, table.facts td { border: 1px solid #d0d4da; padding: 0.4rem 0.6rem; text-align: left; vertical-align: top; }
table.facts th { width: 12rem; background: #f0f2f5; }
.ok { color: #0a6b2f; font-weight: 600; } .bad { color: #a4000f; font-weight: 600; } .warn { color: #6b4a00; font-weight: 600; }
.advice { margin: 1rem 0 0; padding: 0.75rem 1rem; border-radius: 6px; border: 2px solid; font-size: 1.05rem; }
.advice-bad { background: #fde2e2; color: #8f0010; border-color: #a4000f; }
.advice-warn { background: #fff1cc; color: #6b4a00; border-color: #8b6a00; } .advice-ok { background: #ddf3e4; color: #0a5b28; border-color: #0a7a35; }
pre { background: #fff; border: 1px solid #d0d4da; padding: 0.75rem; overflow: auto; }
"""

BOOT = """
(function () {
  var data = JSON.parse(document.getElementById("ds-report-data").textContent);
  var C = window.DraftsmithCharts, run = [{ label: "this drafter", report: data.report || {} }];
  var training = C.trainingFromRecords(data.metrics || []);
  C.lossCurve(document.getElementById("training-loss"), training);
  C.positionAccuracyCurves(document.getElementById("training-positions"), training);
  C.acceptanceByPosition(document.getElementById("acceptance-position"), run);
  C.acceptanceByCategory(document.getElementById("acceptance-category"), run);
  C.speedupByBlockSize(document.getElementById("speedup-block"), data.report || {});
  document.body.setAttribute("data-charts", "drawn");
})();
"""


def render_report_html(report: ValidationReport | Mapping | None, metrics: list[dict], *,
                       title: str = "Draftsmith drafter report") -> str:
    """The whole page as a string; `report` is the model or report.json's object (or None), `metrics` its
    training records. The inline data holds the report as report.json does (the charts read it)."""
    if isinstance(report, ValidationReport):
        report = report.to_json()
    raw = _finite(dict(report)) if isinstance(report, Mapping) else {}
    typed = ValidationReport.read(raw)
    # "<" escaped so no value can close the <script> element the data sits in.
    data = json.dumps({"report": raw, "metrics": _finite(metrics)}, allow_nan=False, default=str).replace("<", "\\u003c")
    sampling = json.dumps(typed.sampling_parameters if typed.sampling_parameters is not None else {}, indent=2)
    summary = _summary(typed) if raw else "<p>This export has no validation report.</p>"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{static_text("vendor/uPlot.min.css")}</style>
<style>{static_text("charts.css")}{STYLE}</style>
</head>
<body>
<header><h1>{_e(title)}</h1><p>Validation on held-out prompts and the training curves of this drafter.
Written by <code>draftsmith export</code>; opens offline.</p></header>
<main>
{_advice(typed)}
{_warm_start_advice(typed)}
<h2>Summary</h2>
<div class="cards">{summary}</div>
<h2>Acceptance</h2>
<div id="acceptance-position"></div>
<div class="grid"><div id="acceptance-category"></div></div>
{_warm_start_section(typed)}
<h2>Lossless</h2>
<table class="facts"><tbody>{_lossless(typed)}</tbody></table>
<h2>Speed</h2>
<div class="grid"><div id="speedup-block"></div></div>
{_confidence_section(typed)}
<h2>Serving engines</h2>
{engine_html(typed.engines)}
<h2>Training</h2>
<div class="grid"><div id="training-loss"></div><div id="training-positions"></div></div>
<h2>Sampling parameters</h2>
{_serving_mode(typed)}
<pre>{_e(sampling)}</pre>
</main>
<script>{static_text("vendor/uPlot.iife.min.js")}</script>
<script>{static_text("charts.js")}</script>
<script>{static_text("bar_charts.js")}</script>
<script type="application/json" id="ds-report-data">{data}</script>
<script>{BOOT}</script>
</body>
</html>
"""
