"""A statistical test that speculative sampling emits the target's distribution.

Draw N short continuations of one prompt with the speculative decoder, and compare the joint law of the
first `tokens` emitted tokens with the target's exact probabilities (after temperature / top-k / top-p)
by a chi-square goodness-of-fit test. Exact probabilities are computed only for the continuations whose
expected count is at least 5 (a pruned enumeration, one batched target pass per depth); every other
continuation is pooled into one cell. The first token comes from the prefill, the following ones from a
draft-verify cycle, so acceptance, rejection and the residual distribution are all exercised.
"""

from __future__ import annotations

from collections import Counter

import torch
from scipy.stats import chisquare

from schemas.sampling import SamplingParams
from trainer.sampling import target_probs
from trainer.speculative import SpeculativeDecoder
from trainer.targets.loading import Target

MIN_EXPECTED = 5.0


def chi_square_p(observed: Counter, expected_probs: dict, draws: int) -> tuple[float, int]:
    """(p-value, cells) of observed counts against probabilities; cells expected < 5 are pooled."""
    big = [cell for cell, prob in expected_probs.items() if prob * draws >= MIN_EXPECTED]
    expected = [expected_probs[cell] * draws for cell in big]
    counts = [observed[cell] for cell in big]
    rest = draws - sum(expected)
    if rest > 1e-3 or sum(counts) < draws:
        # A draw outside the listed cells with (almost) no expected mass must still count against the test.
        expected.append(max(rest, 1e-9))
        counts.append(draws - sum(counts))
    if len(expected) < 2:
        return 1.0, len(expected)
    # The probabilities are float32 products: renormalise away their last-bit drift, which scipy would
    # otherwise reject as observed and expected totals that disagree.
    expected = [value * sum(counts) / sum(expected) for value in expected]
    return float(chisquare(counts, expected).pvalue), len(expected)


@torch.inference_mode()
def frequent_continuations(target: Target, prompt: list[int], params: SamplingParams, tokens: int,
                           draws: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of length `tokens` expected at least 5 times in `draws`."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(tokens):
        prefixes = list(probs)
        if not prefixes:
            break
        batch = torch.tensor([prompt + list(seq) for seq in prefixes], device=target.device)
        logits, _ = target.forward(batch, logits_to_keep=1)
        step = target_probs(logits[:, -1], params).cpu()
        extended: dict[tuple[int, ...], float] = {}
        for row, seq in enumerate(prefixes):
            joint = step[row] * probs[seq]
            for token in (joint * draws >= MIN_EXPECTED).nonzero()[:, 0].tolist():
                extended[seq + (token,)] = float(joint[token])
        probs = extended
    return probs


def sampling_lossless_test(decoder: SpeculativeDecoder, prompt: list[int], params: SamplingParams, *,
                           draws: int = 300, tokens: int = 3, seed: int = 0) -> dict:
    """Run the test; params.temperature must be > 0 (callers test greedy jobs at T=1)."""
    if params.greedy:
        raise ValueError("the sampling test needs temperature > 0")
    params = params.model_copy(update={"max_new_tokens": tokens})
    generator = torch.Generator().manual_seed(seed)
    samples = Counter(
        tuple(decoder.generate(prompt, params, stop_token_ids=[], generator=generator).tokens) for _ in range(draws)
    )
    exact = frequent_continuations(decoder.target, prompt, params, tokens, draws)
    p_value, cells = chi_square_p(samples, exact, draws)
    return {
        "test": f"chi-square goodness of fit of the first {tokens} sampled tokens against the target's exact "
                "probabilities (continuations expected < 5 times pooled)",
        "p_value": p_value, "draws": draws, "cells": cells,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
    }
