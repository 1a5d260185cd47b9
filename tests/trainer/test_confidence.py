"""The calibrated confidence (trainer/confidence.py) and the decoder's confidence-driven draft length: a known
score -> acceptance relation is recovered, AUC equals its pairwise definition, and the adaptive length keeps greedy
output identical to the target's and speculative sampling distributed exactly as the target."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from drafters import random_drafter
from tiny_targets import make_tiny_target

from schemas.sampling import SamplingParams
from trainer.confidence import (
    ConfidenceMap,
    VerifyLength,
    acceptance_pairs,
    auc,
    calibration_figures,
    cross_fitted_maps,
    expected_calibration_error,
    fit_isotonic,
)
from trainer.sampling import target_probs
from trainer.speculative import Cycle, SpeculativeDecoder
from trainer.targets import load_target
from trainer.validation.replay import GreedyReference, replay_greedy
from trainer.validation.sampling_test import chi_square_p

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)
IDENTITY = ConfidenceMap((0.0, 1.0), (0.0, 1.0))
# Verify cost rising with width and a draft cost, so that the chosen length varies with the scores.
COSTS = {"draft": {8: 0.5}, "verify": {w: 1.0 + 0.05 * w for w in range(1, 9)}}


def synthetic(n: int, seed: int):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(size=n)
    return scores, rng.uniform(size=n) < scores ** 2  # P(accepted | score) = score^2


def test_isotonic_recovers_a_known_score_to_acceptance_relation():
    scores, accepted = synthetic(20000, 0)
    fitted = fit_isotonic(scores, accepted)
    grid = np.linspace(0.05, 0.95, 19)
    assert np.abs(fitted(grid) - grid ** 2).max() < 0.06
    assert len(fitted.scores) <= 32 and np.all(np.diff(fitted.acceptance) >= 0)
    fresh_scores, fresh_accepted = synthetic(20000, 1)
    assert expected_calibration_error(fitted(fresh_scores), fresh_accepted) < 0.02
    assert expected_calibration_error(fresh_scores, fresh_accepted) > 0.1  # the raw score is no probability
    assert ConfidenceMap.from_json(fitted.to_json())(grid) == pytest.approx(fitted(grid), abs=1e-5)


def test_auc_equals_the_pairwise_formula_with_ties():
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 6, 300) / 5.0  # many ties
    accepted = rng.uniform(size=300) < scores
    positives, negatives = scores[accepted], scores[~accepted]
    plain = sum((p > q) + 0.5 * (p == q) for p in positives for q in negatives) / (len(positives) * len(negatives))
    assert auc(scores, accepted) == pytest.approx(plain, abs=1e-12)
    assert auc([0.1, 0.2], [True, True]) is None


def test_pairs_are_the_positions_a_cycle_reached():
    cycles = [Cycle(offered=4, accepted=1, emitted=2, scores=(0.9, 0.4, 0.8, 0.7)),
              Cycle(offered=2, accepted=2, emitted=3, scores=(0.6, 0.5)), Cycle(offered=3, accepted=0, emitted=1)]
    assert acceptance_pairs(cycles) == ([0.9, 0.4, 0.6, 0.5], [True, False, True, True])
    per_prompt = [synthetic(400, seed) for seed in range(4)]
    figures = calibration_figures([(list(s), list(a)) for s, a in per_prompt], score="synthetic")
    assert figures["positions"] == 1600 and 0.7 < figures["auc"] < 0.9 and figures["ece"] < 0.08


def test_the_verify_length_stops_at_the_first_draft_that_does_not_pay():
    rule = VerifyLength.from_costs(IDENTITY, COSTS)
    assert rule.choose([0.95] * 7) == 7
    assert rule.choose([0.01] * 7) == 0
    # A confident draft after an unconfident one is not read: the rule never looks past where it stops.
    assert rule.choose([0.95, 0.01, 0.99, 0.99]) == 1
    free = VerifyLength(IDENTITY, 0.0, {w: 1.0 for w in range(1, 9)})  # verifying more costs nothing
    assert free.choose([0.01] * 7) == 7
    # A fixed step from width 1 to 2 (the taps a drafting verify captures) that one draft does not pay but several do.
    step = VerifyLength(IDENTITY, 0.0, {1: 1.0, **{w: 2.0 for w in range(2, 9)}})
    assert step.choose([0.9] * 7) == 7 and step.choose([0.3] * 7) == 0


@pytest.fixture(scope="module")
def peaked_target(tmp_path_factory):
    path = make_tiny_target(tmp_path_factory.mktemp("peaked"), "qwen3", vocab_size=16, hidden_size=32,
                            num_layers=4, init_std=0.3, seed=3)
    return load_target(path)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_adaptive_length_is_greedy_lossless_and_replays_as_it_decodes(tiny_qwen3, variant):
    drafter = random_drafter(tiny_qwen3, variant, block_size=8, scale=0.5)
    plain = SpeculativeDecoder(tiny_qwen3)
    # A map spread over this drafter's own range of scores, so that they drive several lengths.
    scores = [s for c in SpeculativeDecoder(tiny_qwen3, drafter, record_scores=True).generate(
        [5, 6, 7], GREEDY, stop_token_ids=[]).cycles for s in c.scores]
    spread = ConfidenceMap(tuple(np.quantile(scores, [0.1, 0.9])), (0.0, 1.0))
    adaptive = SpeculativeDecoder(tiny_qwen3, drafter, verify_length=VerifyLength.from_costs(spread, COSTS))
    offered = Counter()
    for seed in range(3):
        prompt = torch.randint(5, tiny_qwen3.vocab_size, (4 + 5 * seed,),
                               generator=torch.Generator().manual_seed(seed)).tolist()
        expected = plain.generate(prompt, GREEDY, stop_token_ids=[])
        got = adaptive.generate(prompt, GREEDY, stop_token_ids=[])
        assert got.tokens == expected.tokens
        offered.update(c.offered for c in got.cycles)
        tokens = prompt + expected.tokens
        _, taps = tiny_qwen3.forward(torch.tensor([tokens]), tap_layer_ids=list(drafter.config.target_layer_ids))
        reference = GreedyReference("p", "c", len(prompt), tokens, GREEDY.max_new_tokens, taps[0].float(),
                                    tuple(drafter.config.target_layer_ids))
        replayed = replay_greedy(tiny_qwen3, drafter, reference, stop_token_ids=[], decoder=adaptive)
        assert [(c.offered, c.accepted) for c in replayed] == [(c.offered, c.accepted) for c in got.cycles]
    assert len(offered) > 1, "the scores should drive several lengths"


def test_the_score_is_the_drafts_probability_at_t0(tiny_qwen3):
    drafter = random_drafter(tiny_qwen3, "dflash", block_size=4)
    hidden = torch.randn(1, 3, tiny_qwen3.hidden_size)
    logits = tiny_qwen3.lm_head(hidden)
    drafts = logits.argmax(-1)
    expected = torch.softmax(logits, -1).gather(-1, drafts[..., None])[..., 0]
    assert drafter.confidence(hidden, logits, torch.tensor([5]), drafts) == pytest.approx(expected)


def exact_sequence_probs(target, prompt, params, new_tokens):
    probs = {(): 1.0}
    for _ in range(new_tokens):
        prefixes = list(probs)
        logits, _ = target.forward(torch.tensor([prompt + list(seq) for seq in prefixes]))
        step = target_probs(logits[:, -1], params)
        probs = {seq + (t,): probs[seq] * float(step[row, t])
                 for row, seq in enumerate(prefixes) for t in range(target.vocab_size) if step[row, t] > 0}
    return probs


def test_adaptive_length_keeps_speculative_sampling_exact(peaked_target):
    """Every marginal and the joint law of 3 tokens, sampled with the adaptive length, against the target's exact
    distribution: the end-to-end check. Its power against a score that read the drawn token is low here (a random
    drafter's q barely overlaps the peaked target's p, so selecting drafts by q shifts little: not caught at 3000
    draws); the condition itself is held exactly by test_a_score_never_reads_the_draft_at_its_own_position."""
    params, prompt, draws = SamplingParams(temperature=1.0, max_new_tokens=3), [6, 7, 8], 600
    drafter = random_drafter(peaked_target, "dflash2", block_size=4, selector_top_k=8, selector_rank=8, scale=0.5)
    rule = VerifyLength(IDENTITY, 0.1, {1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9})  # each draft must pay: lengths vary
    decoder = SpeculativeDecoder(peaked_target, drafter, verify_length=rule)
    generator = torch.Generator().manual_seed(0)
    samples, offered = [], Counter()
    for _ in range(draws):
        result = decoder.generate(prompt, params, stop_token_ids=[], generator=generator)
        samples.append(tuple(result.tokens))
        offered.update(c.offered for c in result.cycles)
    assert len(offered) > 1
    exact = exact_sequence_probs(peaked_target, prompt, params, 3)
    p_values = [chi_square_p(Counter(samples), exact, draws)[0]]
    for position in range(3):
        marginal: Counter = Counter()
        for seq, prob in exact.items():
            marginal[seq[position]] += prob
        p_values.append(chi_square_p(Counter(s[position] for s in samples), marginal, draws)[0])
    assert min(p_values) * len(p_values) > 1e-3


def test_validation_reports_the_confidence_and_export_ships_the_map(tiny_qwen3, tmp_path):
    import json

    from schemas.validation_report import ValidationReport
    from trainer.data.prompts import Prompt
    from trainer.drafter.checkpoint import save_drafter
    from trainer.export.artifacts import write_engine_drafters
    from trainer.validation.report import validate

    drafter = random_drafter(tiny_qwen3, block_size=4, num_layers=1)
    prompts = [Prompt(f"p{i}", ("chat", "code")[i % 2], ({"role": "user", "content": f"Say {i} things."},))
               for i in range(4)]
    report = validate(tiny_qwen3, drafter, prompts, SamplingParams(temperature=0.0), max_new_tokens=10,
                      sampling_draws=20, sampling_prompts=1)
    confidence = ValidationReport.read(json.loads(json.dumps(report.to_json()))).confidence
    assert confidence is not None and confidence.positions > 0 and confidence.prompts == 4
    assert confidence.map.score and len(confidence.map.score) == len(confidence.map.acceptance)
    row = confidence.adaptive_length
    assert row.fixed_block_size == report.recommended_block_size and 1.0 <= row.tau <= 4
    assert row.speed_ratio_ci95[0] <= row.speed_ratio <= row.speed_ratio_ci95[1]
    save_drafter(drafter, tmp_path / "trained")
    write_engine_drafters(tmp_path / "trained", None, tiny_qwen3, tmp_path / "out", ggufs=(),
                          confidence=confidence.map.to_json())
    shipped = json.loads((tmp_path / "out" / "drafter" / "config.json").read_text())["draftsmith"]["confidence"]
    assert shipped["score"] == confidence.map.score and "isotonic" in shipped["method"]
    from report.html import render_report_html

    page = render_report_html(report, [])
    assert 'id="confidence"' in page and "adaptive length" in page


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_a_score_never_reads_the_draft_at_its_own_position(tiny_qwen3, variant):
    """What keeps the adaptive length exact under sampling: the score at position t is the same whatever tokens the
    walk drew at t and after (a score that read them, e.g. the drawn token's probability, would bias the output)."""
    drafter = random_drafter(tiny_qwen3, variant, block_size=6, scale=0.5)
    hidden = torch.randn(1, 5, tiny_qwen3.hidden_size)
    logits = tiny_qwen3.lm_head(hidden)
    generator = torch.Generator().manual_seed(0)
    candidates = logits.topk(8, dim=-1).indices  # tokens a walk can draw, so a score that read them would differ

    def drawn() -> torch.Tensor:
        return candidates[0].gather(-1, torch.randint(0, 8, (5, 1), generator=generator))[:, 0]

    path = drawn()[None]
    scores = drafter.confidence(hidden, logits, torch.tensor([5]), path)
    for t in range(5):
        other = path.clone()
        other[0, t:] = drawn()[t:]
        assert torch.equal(drafter.confidence(hidden, logits, torch.tensor([5]), other)[0, :t + 1], scores[0, :t + 1])


def test_decode_reads_the_shipped_map(tiny_qwen3, tmp_path):
    """`draftsmith decode --adaptive-length`: the map from the drafter's config.json, step costs measured first."""
    import json

    from click.testing import CliRunner

    from trainer.cli import decode
    from trainer.drafter.checkpoint import save_drafter

    drafter_dir = save_drafter(random_drafter(tiny_qwen3, block_size=4, num_layers=1), tmp_path / "drafter")
    args = ["--target", str(tiny_qwen3.path), "--drafter", str(drafter_dir), "--prompt", "Say 3 things.",
            "--max-new-tokens", "6", "--adaptive-length"]
    refused = CliRunner().invoke(decode, args)
    assert refused.exit_code != 0 and "draftsmith.confidence" in refused.output
    config = json.loads((drafter_dir / "config.json").read_text())
    config.setdefault("draftsmith", {})["confidence"] = IDENTITY.to_json()
    (drafter_dir / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(decode, args)
    assert result.exit_code == 0, result.output
    assert "tau" in result.output


def test_one_prompt_has_no_cross_fitted_map_and_no_adaptive_row(tiny_qwen3):
    from trainer.data.prompts import Prompt
    from trainer.validation.confidence_report import adaptive_row

    pairs = [([0.2, 0.7], [False, True])]
    assert cross_fitted_maps(pairs) == [None]
    figures = calibration_figures(pairs, score="one prompt")
    assert figures["ece"] is None and figures["auc"] == 1.0 and figures["map"]["score"] == [0.2, 0.7]
    prompt = Prompt("p0", "c", ({"role": "user", "content": "hi"},))
    assert adaptive_row(tiny_qwen3, random_drafter(tiny_qwen3, block_size=4, num_layers=1), [prompt], [[5, 6]],
                        [[7, 8]], pairs, COSTS, 4, 4) is None


def test_adaptive_length_over_a_draft_vocabulary_is_greedy_lossless(tiny_qwen3):
    drafter = random_drafter(tiny_qwen3, "dflash2", block_size=8, scale=0.5)
    drafter.draft_vocab = torch.arange(0, tiny_qwen3.vocab_size, 2)  # every other token
    rule = VerifyLength(ConfidenceMap((0.05, 0.3), (0.0, 1.0)), 0.5, COSTS["verify"])
    got = SpeculativeDecoder(tiny_qwen3, drafter, verify_length=rule).generate([5, 6, 7], GREEDY, stop_token_ids=[])
    assert got.tokens == SpeculativeDecoder(tiny_qwen3).generate([5, 6, 7], GREEDY, stop_token_ids=[]).tokens
    assert all(0.0 < s <= 1.0 for c in got.cycles for s in c.scores)
