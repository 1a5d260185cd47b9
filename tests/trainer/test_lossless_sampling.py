"""Sampling losslessness: tokens emitted by speculative decoding at T=1 (with and without top-p/top-k)
follow the target's own distribution exactly.

On a tiny target with a 16-token vocabulary the exact joint probability of every 4-token continuation is
computable, so a chi-square goodness-of-fit test compares observed sequence counts against it. A block
of 3 exercises every path: acceptance, rejection at either draft (residual draw), and the bonus token.
The last test shows the check has teeth: with the residual computed wrongly it fails.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from drafters import random_drafter
from tiny_targets import make_tiny_target

import trainer.sampling
from schemas.sampling import SamplingParams
from trainer.sampling import target_probs
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.validation.sampling_test import chi_square_p

PROMPT = [6, 7, 8]
NEW_TOKENS = 4
DRAWS = 1000
"""Sized by its power: a wrong residual is caught (p < 1e-3) on 5 of 5 seeds at 1,000 draws and on none at 500
(`python -m bench.lossless_sampling_power`)."""


@pytest.fixture(scope="module")
def peaked_target(tmp_path_factory):
    # A larger init scale gives peaked next-token distributions that differ a lot from a random drafter's.
    path = make_tiny_target(tmp_path_factory.mktemp("peaked"), "qwen3", vocab_size=16, hidden_size=32,
                            num_layers=4, init_std=0.3, seed=3)
    return load_target(path)


def exact_sequence_probs(target, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1..x4 | prompt) under the target with the job's filters, by enumerating every prefix."""
    vocab = target.vocab_size
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(NEW_TOKENS):
        prefixes = [seq for seq, prob in probs.items() if prob > 0]
        batch = torch.tensor([PROMPT + list(seq) for seq in prefixes])
        logits, _ = target.forward(batch)
        step = target_probs(logits[:, -1], params)
        probs = {seq + (token,): probs[seq] * float(step[row, token])
                 for row, seq in enumerate(prefixes) for token in range(vocab) if step[row, token] > 0}
    return probs


def goodness_of_fit(target, drafter, params: SamplingParams, seed: int = 0) -> float:
    """Smallest Bonferroni-corrected p-value of DRAWS speculative samples against the exact target distribution
    (`fit_p_value`)."""
    return fit_p_value(speculative_samples(target, drafter, params, DRAWS, seed), exact_sequence_probs(target, params))


def speculative_samples(target, drafter, params: SamplingParams, draws: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`draws` continuations of PROMPT by speculative decoding at block 3, seeded."""
    decoder = SpeculativeDecoder(target, drafter, block_size=3)
    generator = torch.Generator().manual_seed(seed)
    prefill = decoder.prefill(PROMPT)  # every draw starts from one prompt pass, as validation's check does
    return [tuple(decoder.generate(PROMPT, params, stop_token_ids=[], generator=generator, prefill=prefill).tokens)
            for _ in range(draws)]


def fit_p_value(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    """Smallest Bonferroni-corrected p-value of the samples against the exact distribution: the joint law of the
    whole continuation, and the marginal of every drafted position (few cells, so a wrong residual shows up with
    few draws)."""
    assert set(samples) <= set(exact), "a sequence the target cannot produce was emitted"
    draws = len(samples)
    p_values = [chi_square_p(Counter(samples), exact, draws)[0]]
    for position in range(1, NEW_TOKENS):
        marginal: Counter = Counter()
        for seq, prob in exact.items():
            marginal[seq[position]] += prob
        p_values.append(chi_square_p(Counter(seq[position] for seq in samples), marginal, draws)[0])
    return min(p_values) * len(p_values)


CASES = [
    ("dflash2", SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)),
    ("dflash2", SamplingParams(temperature=1.0, top_p=0.8, top_k=6, max_new_tokens=NEW_TOKENS)),
    ("dflash", SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)),
    ("dflash", SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=NEW_TOKENS)),
]


@pytest.mark.parametrize(("variant", "params"), CASES, ids=["dflash2-T1", "dflash2-topp-topk", "dflash-T1",
                                                            "dflash-T0.7-topp-topk"])
def test_speculative_sampling_matches_target_distribution(peaked_target, variant, params):
    drafter = random_drafter(peaked_target, variant, block_size=3, selector_top_k=8, selector_rank=8, scale=0.5)
    assert goodness_of_fit(peaked_target, drafter, params) > 1e-3


def test_wrong_residual_is_caught(peaked_target, monkeypatch):
    """Resampling from p instead of norm(max(p - q, 0)) after a rejection over-weights tokens the drafter
    already proposes; the same test must reject that decoder."""
    monkeypatch.setattr(trainer.sampling, "residual_distribution", lambda p, q: p)
    drafter = random_drafter(peaked_target, "dflash2", block_size=3, selector_top_k=8, selector_rank=8, scale=0.5)
    assert goodness_of_fit(peaked_target, drafter, CASES[0][1]) < 1e-3


def test_exact_distribution_sums_to_one(peaked_target):
    exact = exact_sequence_probs(peaked_target, CASES[1][1])
    assert abs(sum(exact.values()) - 1.0) < 1e-4
    assert all(len(seq) == NEW_TOKENS for seq in itertools.islice(exact, 10))


def test_a_sampling_test_that_could_test_nothing_is_inconclusive_not_passed(peaked_target):
    """Too few draws for any prefix to be tested: the test says so and what would fix it; the validation verdict
    then refuses a sampling job (its proof is that test) and reports a greedy job's check as not tested."""
    from trainer.validation.report import SamplingInconclusive, require_passed
    from trainer.validation.sampling_test import MIN_GROUP, sampling_lossless_test

    drafter = random_drafter(peaked_target, "dflash2", block_size=3, selector_top_k=8, selector_rank=8, scale=0.5)
    decoder = SpeculativeDecoder(peaked_target, drafter, block_size=3)
    few = sampling_lossless_test(decoder, [PROMPT, PROMPT[:2]], SamplingParams(temperature=1.0), draws=MIN_GROUP)
    assert few["status"] == "inconclusive" and few["degrees_of_freedom"] == 0
    assert f"validation.sampling_draws to at least {2 * MIN_GROUP}" in few["reason"]
    enough = sampling_lossless_test(decoder, [PROMPT], SamplingParams(temperature=1.0), draws=200)
    assert enough["status"] == "tested" and enough["degrees_of_freedom"] > 0

    report = {"passed": False, "lossless": {"greedy": {"mismatches": 0}, "sampling": {**few, "passed": False}}}
    with pytest.raises(SamplingInconclusive, match="could not test anything"):
        require_passed(report)
