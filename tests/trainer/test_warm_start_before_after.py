"""A warm start, before and after (trainer/validation/report.py `validate(parent=)`): the parent is measured on the
same rendered prompts, greedy references and seeds as the new drafter, at T=0 and at the job's temperature, in the
job's serving mode; the paired gain carries its interval, and the advice to keep serving the parent follows that
interval into report.json, report.html and the model card. Tiny random drafters: seconds."""

from __future__ import annotations

import hashlib

import pytest
from drafters import random_drafter

from report.html import render_report_html
from schemas.sampling import ChatTemplateOptions, SamplingParams
from schemas.validation_report import ServingMode, ValidationReport
from trainer.data.prompts import Prompt
from trainer.export.model_card import _warm_start
from trainer.validation.report import validate
from trainer.validation.sampled_acceptance import advice_from_gain, paired_gain

BLOCK = 4
SYSTEM = "Answer in one line."
SERVED = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=12, seed=7,
                        chat_template=ChatTemplateOptions(enable_thinking=False, system_prompt=SYSTEM))


def prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", ("chat", "code")[i % 2], ({"role": "user", "content": f"Say something about {i} things."},))
            for i in range(count)]


@pytest.fixture(scope="module")
def beside_itself(tiny_qwen3) -> ValidationReport:
    """A drafter validated with itself as its parent: the two measurements must pair exactly."""
    drafter = random_drafter(tiny_qwen3, block_size=BLOCK, num_layers=1)
    return validate(tiny_qwen3, drafter, prompts(4), SERVED, max_new_tokens=12, sampling_draws=30,
                    sampling_prompts=1, parent=drafter)


def test_the_parent_is_measured_at_t0_and_at_the_jobs_temperature_on_the_same_prompts_and_seeds(beside_itself):
    report = beside_itself
    warm = report.warm_start
    # The same drafter on the same prompts, references and seeds: its two measurements are one and the same.
    assert warm.parent_tau_greedy.to_json() == report.tau_greedy.to_json() == warm.tau_greedy.to_json()
    assert warm.parent_tau_sampled.to_json() == report.tau_sampled.to_json() == warm.tau_sampled.to_json()
    assert warm.parent_tau_greedy.temperature == 0.0 and warm.parent_tau_sampled.temperature == 0.8
    assert warm.parent_tau_sampled.same_as_greedy is False
    for figure in (warm.parent_tau_greedy, warm.parent_tau_sampled):
        low, high = figure.ci95
        assert low <= figure.tau <= high
    assert warm.parent_tau == report.tau == warm.tau and warm.gain_over_parent == 0.0
    assert warm.gain_greedy.temperature == 0.0 and warm.gain_sampled.temperature == 0.8
    for gain in (warm.gain_greedy, warm.gain_sampled):
        assert gain.ratio == 1.0 and gain.ci95 == [1.0, 1.0] and gain.prompts == 4


def test_a_gain_whose_interval_does_not_lie_above_1_says_to_keep_serving_the_parent(beside_itself):
    warm = beside_itself.warm_start
    assert warm.advice == "keep_parent" and warm.keep_parent
    assert warm.advice_reason.startswith("keep serving the parent: the gain's 95 % interval does not lie above 1")
    assert "T=0.8" in warm.advice_reason  # judged at the parameters the job serves at

    page = render_report_html(beside_itself, [])
    assert 'id="warm-start-advice" data-advice="keep_parent"' in page
    assert "Keep serving the parent: the gain&#x27;s 95 % interval does not lie above 1" in page
    assert 'id="warm-start"' in page and "ratio new / parent [95 %, paired]" in page
    card = _warm_start(beside_itself)
    assert "**Keep serving the parent:** Keep serving the parent" in card
    assert "| T=0 (greedy) | " in card and "| 1x [1, 1] |" in card
    assert "T=0.8, top-p 0.9, top-k 20 (the job's)" in card


def test_the_serving_mode_is_recorded_with_every_tau(beside_itself):
    mode = beside_itself.serving_mode
    assert (mode.enable_thinking, mode.has_system_prompt) == (False, True)
    assert mode.system_prompt_sha256 == hashlib.sha256(SYSTEM.encode()).hexdigest()
    assert (mode.temperature, mode.top_p, mode.top_k) == (0.8, 0.9, 20)
    assert "tokenize_prompts" in mode.rendered_by  # the call regeneration renders the training prompts with
    assert beside_itself.warm_start.serving_mode == mode
    assert SYSTEM not in mode.model_dump_json()  # the prompt itself is not repeated, only its hash
    summary = f"thinking off, system prompt {mode.system_prompt_sha256[:8]}, T=0.8, top-p 0.9, top-k 20"
    assert mode.summary() == summary
    assert summary in render_report_html(beside_itself, []) and summary in _warm_start(beside_itself)
    greedy = ServingMode.of(SamplingParams().model_dump(mode="json"))
    assert greedy.summary() == "thinking: the template's default, no system prompt, greedy (T=0)"


def test_the_paired_gain_is_the_ratio_of_taus_and_only_an_interval_above_1_serves_the_new_drafter():
    parent = [(10, 8), (12, 10), (9, 9), (20, 12), (11, 10), (14, 9)]
    better = [(e + 4, c) for e, c in parent]  # every prompt gains
    gain = paired_gain(better, parent, temperature=0.7, seed=0)
    assert gain["ratio"] == round((sum(e for e, _ in better) / 58) / (76 / 58), 4)
    assert 1.0 < gain["ci95"][0] <= gain["ratio"] <= gain["ci95"][1]
    assert gain["difference"] == round(24 / 58, 4) and gain["difference_ci95"][0] > 0
    advice, reason = advice_from_gain(gain)
    assert advice == "serve_new" and "beats its parent" in reason and "T=0.7" in reason

    mixed = [(e + (6 if i % 2 else -5), c) for i, (e, c) in enumerate(parent)]  # gains and losses: not shown
    gain = paired_gain(mixed, parent, temperature=0.0, seed=0)
    assert gain["ci95"][0] <= 1.0
    assert advice_from_gain(gain)[0] == "keep_parent"


def test_the_parents_origin_and_format_recorded_at_prepare_reach_the_report_and_the_card():
    from schemas.work_files import PreparedParent
    from trainer.pipeline import parent_description

    prepared = PreparedParent.read({"path": "/work/parent", "origin": {
        "format": "z-lab", "variant": "dflash", "upgrades": ["DFlash to DFlash 2 (identity convolutions)"],
        "dropped_tensors": ["lm_head.weight (the target's own head)"], "notes": ["taps kept from the parent"]}})
    parent = parent_description(prepared, "hf://z-lab/smollm2-dflash")
    assert parent.name == "hf://z-lab/smollm2-dflash" and parent.format == "z-lab" and parent.variant == "dflash"
    report = ValidationReport(warm_start={"parent": parent.to_json(), "prompts": 6, "parent_tau": 1.2, "tau": 1.3})
    assert ("Started from the parent drafter `hf://z-lab/smollm2-dflash` (z-lab format, dflash); upgraded: DFlash to "
            "DFlash 2 (identity convolutions); dropped: lm_head.weight (the target's own head); note: taps kept from "
            "the parent.") in _warm_start(report)
    assert "z-lab format, dflash" in render_report_html(report, [])
    older = parent_description(PreparedParent.read({"path": "/work/parent"}), "/work/parent")
    assert older.to_json() == {"name": "/work/parent"}  # a prepare.json that recorded no origin


def test_compare_with_parent_measures_a_parent_on_disk_the_way_validation_does(tiny_qwen3, beside_itself, tmp_path):
    from trainer.audit import compare_with_parent
    from trainer.drafter.checkpoint import save_drafter

    drafter = random_drafter(tiny_qwen3, block_size=BLOCK, num_layers=1)  # the drafter `beside_itself` validated
    save_drafter(drafter, tmp_path / "parent")
    paired = compare_with_parent(tiny_qwen3, tmp_path / "parent", prompts(4), SERVED, max_new_tokens=12, tau=1.0,
                                 drafter=drafter)
    assert paired["parent_tau_greedy"] == beside_itself.warm_start.parent_tau_greedy.to_json()
    assert paired["parent_tau_sampled"] == beside_itself.warm_start.parent_tau_sampled.to_json()
    assert paired["gain_sampled"]["ratio"] == 1.0 and paired["advice"] == "keep_parent"
    alone = compare_with_parent(tiny_qwen3, tmp_path / "parent", prompts(4), SERVED, max_new_tokens=12, tau=1.5)
    assert alone["parent_tau"] == beside_itself.warm_start.parent_tau and alone["gain_over_parent"] == round(
        1.5 - alone["parent_tau"], 4)
