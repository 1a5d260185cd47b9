"""tau at T=0 and at the job's own sampling parameters (trainer/validation/sampled_acceptance.py): the sampled figure
is measured by the real speculative-sampling decoder on a tiny target, a greedy job reports its T=0 figure once, and
both survive report.json's typed model, its lenient reader, the model card and report.html."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drafters import random_drafter

from report.html import render_report_html
from schemas.sampling import SamplingParams
from schemas.validation_report import ValidationReport
from trainer.data.prompts import Prompt
from trainer.export.model_card import _figures
from trainer.validation.report import validate
from trainer.validation.sampled_acceptance import sampled_acceptance, tau_figure

SAMPLE = Path(__file__).resolve().parents[1] / "dashboard" / "data" / "sample_job" / "report.json"
BLOCK = 4
SAMPLING = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=12, seed=7)


def prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", ("chat", "code")[i % 2], ({"role": "user", "content": f"Say something about {i} things."},))
            for i in range(count)]


@pytest.fixture(scope="module")
def drafter(tiny_qwen3):
    return random_drafter(tiny_qwen3, block_size=BLOCK, num_layers=1)


def small_validate(target, drafter, params: SamplingParams) -> ValidationReport:
    return validate(target, drafter, prompts(3), params, max_new_tokens=12, sampling_draws=30, sampling_prompts=1)


@pytest.fixture(scope="module")
def sampling_report(tiny_qwen3, drafter) -> ValidationReport:
    return small_validate(tiny_qwen3, drafter, SAMPLING)


@pytest.fixture(scope="module")
def greedy_report(tiny_qwen3, drafter) -> ValidationReport:
    return small_validate(tiny_qwen3, drafter, SAMPLING.model_copy(update={"temperature": 0.0}))


def test_sampled_tau_is_measured_by_the_decoder_with_an_interval(tiny_qwen3, drafter):
    measured = sampled_acceptance(tiny_qwen3, drafter, prompts(4), SAMPLING)
    # A prompt may stop at its first (prefill) token and go through no cycle; the prompts together must not.
    assert len(measured.per_prompt) == 4 and sum(cycles for _, cycles in measured.per_prompt) > 0
    figure = tau_figure(measured.per_prompt, SAMPLING, block_size=BLOCK, measured_by="test")
    assert 1.0 <= figure["tau"] <= BLOCK and figure["tau"] == round(measured.tau, 4)
    low, high = figure["ci95"]
    assert low <= figure["tau"] <= high
    assert figure["cycles"] == measured.stats.overall.cycles > 0 and figure["tokens"] > 0
    assert (figure["temperature"], figure["top_p"], figure["top_k"]) == (0.8, 0.9, 20)
    again = sampled_acceptance(tiny_qwen3, drafter, prompts(4), SAMPLING)
    assert again.per_prompt == measured.per_prompt  # seeded per prompt: the same figure twice
    assert tau_figure(again.per_prompt, SAMPLING, block_size=BLOCK, measured_by="test") == figure


def test_a_sampling_job_reports_both_figures_and_they_round_trip(sampling_report):
    report = sampling_report
    greedy, sampled = report.tau_greedy, report.tau_sampled
    assert greedy.temperature == 0.0 and greedy.same_as_greedy is None and "replay" in greedy.measured_by
    assert sampled.same_as_greedy is False and "speculative sampling" in sampled.measured_by
    assert (sampled.temperature, sampled.top_p, sampled.top_k) == (0.8, 0.9, 20)
    for figure in (greedy, sampled):
        assert figure.prompts == 3 and figure.cycles > 0 and figure.block_size == BLOCK
        assert 1.0 <= figure.tau <= BLOCK and figure.ci95[0] <= figure.tau <= figure.ci95[1]
    assert report.tau == sampled.tau  # the headline stays at the job's own parameters

    written = json.loads(json.dumps(report.to_json()))
    assert ValidationReport.model_validate(written).to_json() == written  # the typed model, strictly
    read = ValidationReport.read(written)  # the lenient reader
    assert read.tau_sampled == sampled and read.tau_greedy == greedy
    assert ValidationReport.read({**written, "tau_sampled": "odd"}).tau_sampled is None  # dropped, not fatal


def test_a_greedy_job_reports_its_t0_figure_once(greedy_report):
    report = greedy_report
    greedy, sampled = report.tau_greedy, report.tau_sampled
    assert sampled.same_as_greedy is True and sampled.temperature == 0.0 and "greedy" in sampled.measured_by
    assert sampled.tau == greedy.tau == report.tau and sampled.ci95 == greedy.ci95
    assert greedy.cycles == report.cycles  # the replay measured it; nothing was decoded twice


def test_the_card_and_report_html_show_both_figures(sampling_report):
    report = sampling_report
    greedy, sampled = report.tau_greedy, report.tau_sampled
    card = _figures(report)
    assert f"| tau at T=0 (greedy, replayed) | {greedy.tau} (95 % interval {greedy.ci95[0]}-{greedy.ci95[1]})" in card
    assert (f"| tau at the job's temperature (T=0.8, top-p 0.9, top-k 20; speculative sampling, measured) | "
            f"{sampled.tau} (95 % interval {sampled.ci95[0]}-{sampled.ci95[1]})") in card
    page = render_report_html(report, [])
    assert f'data-figure="τ at T=0 (greedy)">{round(greedy.tau, 3):g}<' in page
    assert f'data-figure="τ at the job&#x27;s T=0.8">{round(sampled.tau, 3):g}<' in page
    assert f"95 % interval {round(sampled.ci95[0], 3):g}–{round(sampled.ci95[1], 3):g}" in page

    older = ValidationReport.load(SAMPLE)  # written before both figures: no row, no card
    assert "tau at T=0" not in _figures(older) and "τ at T=0" not in render_report_html(older, [])


def test_a_greedy_jobs_card_says_its_figure_is_the_t0_one(greedy_report):
    assert f"| tau at the job's temperature (T=0.0) | {greedy_report.tau}: the job is greedy" in _figures(greedy_report)
    assert "the job is greedy: the T=0 figure" in render_report_html(greedy_report, [])


def test_the_bench_and_the_audit_measure_it_the_same_way(tiny_qwen3, drafter):
    from bench.sampled_tau import sampled_tau
    from trainer.audit import measure_tau

    measured = sampled_acceptance(tiny_qwen3, drafter, prompts(3), SAMPLING)
    bench = sampled_tau(tiny_qwen3, drafter, prompts(3), temperature=0.8, max_new_tokens=12, seed=7, top_p=0.9,
                        top_k=20)
    assert bench["per_prompt"] == measured.per_prompt and bench["tau"] == round(measured.tau, 4)
    assert measure_tau(tiny_qwen3, drafter, prompts(3), SAMPLING, max_new_tokens=12)["tau"] == round(measured.tau, 4)
