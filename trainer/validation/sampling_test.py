"""A statistical test that speculative sampling emits the target's distribution, with power.

For each of several prompts, draw short continuations (`tokens` tokens) with the speculative decoder and
test every emitted token against the target's exact conditional distribution given what came before it:
draws are grouped by their prefix (prompt + tokens so far), and each group holding at least
`MIN_GROUP` draws gets a chi-square goodness-of-fit test of its next token against the target's exact
probabilities (after temperature / top-k / top-p; tokens expected fewer than 5 times are pooled in one
cell). A multinomial over a tree factorises into these conditional multinomials, independent given the
group counts, so the statistics and degrees of freedom add up to one chi-square test.

Why this design: testing whole continuations against their joint probabilities (the previous test) leaves
almost every draw in one pooled cell on a real 49k-vocabulary target at T=1 (report.json showed 2 cells for
300 draws), so a wrong residual passed. Conditioning keeps the cells populated: after a given prefix the
next token has a few likely values. The first token comes from the prefill; the following ones come from
a draft-verify cycle (acceptance, rejection with the residual norm(max(p - q, 0)), bonus), which is where
a decoder can go wrong. tests/trainer/test_sampling_check_power.py shows the test rejects a decoder that
resamples from p after a rejection, on SmolLM2 with the default settings.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

import torch
from scipy.stats import chi2, chisquare, kstest

from schemas.sampling import SamplingParams
from trainer.sampling import seeded_generator, target_probs
from trainer.speculative import SpeculativeDecoder

MIN_EXPECTED = 5.0
MIN_GROUP = 15
"""Draws a prefix needs before its next token is tested (smaller groups leave almost everything pooled)."""
DRAW_GROUP = 25
"""Draws between two calls of `on_progress` (a caller's cancel poll: a few seconds of decoding at most)."""


def chi_square_p(observed: Counter, expected_probs: dict, draws: int) -> tuple[float, int]:
    """(p-value, cells) of observed counts against probabilities; cells expected < 5 are pooled."""
    statistic, cells = chi_square_statistic(observed, expected_probs, draws)
    if cells < 2:
        return 1.0, cells
    return float(chi2.sf(statistic, cells - 1)), cells


def chi_square_statistic(observed: Counter, expected_probs: dict, draws: int) -> tuple[float, int]:
    """(Pearson statistic, cells) with cells expected < 5 pooled into one 'other' cell."""
    big = [cell for cell, prob in expected_probs.items() if prob * draws >= MIN_EXPECTED]
    expected = [expected_probs[cell] * draws for cell in big]
    counts = [observed[cell] for cell in big]
    rest = draws - sum(expected)
    if rest > 1e-3 or sum(counts) < draws:
        # A draw outside the listed cells with (almost) no expected mass must still count against the test.
        expected.append(max(rest, 1e-9))
        counts.append(draws - sum(counts))
    if len(expected) < 2:
        return 0.0, len(expected)
    # The probabilities are float32: renormalise away their last-bit drift before comparing.
    expected = [value * sum(counts) / sum(expected) for value in expected]
    return float(chisquare(counts, expected).statistic), len(expected)


@torch.inference_mode()
def next_token_probs(target, sequences: list[list[int]], params: SamplingParams) -> torch.Tensor:
    """The target's exact next-token distribution after each sequence (job's filters applied); sequences of
    one length go through in one batch."""
    out: dict[int, torch.Tensor] = {}
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, sequence in enumerate(sequences):
        by_length[len(sequence)].append(index)
    for indices in by_length.values():
        for start in range(0, len(indices), 32):
            chunk = indices[start:start + 32]
            batch = torch.tensor([sequences[i] for i in chunk], device=target.device)
            logits, _ = target.forward(batch, logits_to_keep=1)
            for row, index in enumerate(chunk):
                out[index] = target_probs(logits[row, -1], params).cpu()
    return torch.stack([out[i] for i in range(len(sequences))])


def randomized_pit(probs: torch.Tensor, token: int, uniform: float) -> float:
    """Randomised probability integral transform of a discrete draw: tokens ordered by probability (most
    likely first, ties by id), u = P(tokens before it) + uniform * P(it). Exactly U(0, 1) when the draw
    follows `probs`, whatever `probs` is; a decoder that favours likely tokens pushes u towards 0."""
    p_token = float(probs[token])
    ties_before = int(((probs == probs[token]).nonzero()[:, 0] < token).sum())
    before = float(probs[probs > probs[token]].sum()) + p_token * ties_before
    return before + uniform * p_token


def sampling_lossless_test(decoder: SpeculativeDecoder, prompts: list[list[int]], params: SamplingParams, *,
                           draws: int = 300, tokens: int = 3, seed: int = 0,
                           on_progress: Callable[[int], None] | None = None) -> dict:
    """Run the test over `prompts` (draws split evenly); params.temperature must be > 0 (callers test greedy
    jobs at T=1). Two statistics over the same draws, combined with Bonferroni: the grouped chi-square
    (every tested prefix's next-token counts against the exact probabilities) and a Kolmogorov-Smirnov test
    that the randomised PIT values of every token drawn by a draft-verify cycle are uniform (no grouping, so
    every speculative token counts; most sensitive to a decoder that over- or under-draws likely tokens).

    `status` is "tested" when the chi-square part tested at least one prefix (the caller compares p_value with
    its alpha), "inconclusive" when it could test none: too few draws per prompt, never a pass. `on_progress`
    is called every DRAW_GROUP draws and after every prompt, with the prompts finished since its last call (0 or
    1); a caller may stop there, since one prompt's draws can take minutes when a job asks for many."""
    if params.greedy:
        raise ValueError("the sampling test needs temperature > 0")
    params = params.model_copy(update={"max_new_tokens": tokens})
    generator = seeded_generator(seed, decoder.target.device)
    pit_rng = seeded_generator(seed + 1)  # its uniforms are drawn on the CPU, beside the probabilities they read
    per_prompt = max(1, draws // len(prompts))
    statistic, degrees, groups, tested_draws = 0.0, 0, 0, 0
    by_depth: dict[int, int] = defaultdict(int)
    pit: list[float] = []
    for prompt in prompts:
        prefill = decoder.prefill(prompt)  # every draw starts from the same prompt pass
        samples: list[tuple[int, ...]] = []
        for draw in range(per_prompt):
            if on_progress and draw and draw % DRAW_GROUP == 0:
                on_progress(0)
            samples.append(tuple(decoder.generate(prompt, params, stop_token_ids=[], generator=generator,
                                                  prefill=prefill).tokens))
        for depth in range(tokens):
            prefixes = Counter(sample[:depth] for sample in samples if len(sample) > depth)
            distinct = list(prefixes)
            exact = next_token_probs(decoder.target, [prompt + list(prefix) for prefix in distinct], params)
            row_of = {prefix: row for row, prefix in enumerate(distinct)}
            if depth > 0:  # the first token is the prefill's plain draw; the rest come from draft-verify cycles
                for sample in samples:
                    if len(sample) > depth:
                        u = float(torch.rand((), generator=pit_rng))
                        pit.append(randomized_pit(exact[row_of[sample[:depth]]], sample[depth], u))
            for prefix in (p for p, count in prefixes.items() if count >= MIN_GROUP):
                row = exact[row_of[prefix]]
                observed = Counter(s[depth] for s in samples if len(s) > depth and s[:depth] == prefix)
                probs = {token: float(row[token]) for token in row.nonzero()[:, 0].tolist()}
                value, cells = chi_square_statistic(observed, probs, prefixes[prefix])
                if cells >= 2:
                    statistic, degrees, groups = statistic + value, degrees + cells - 1, groups + 1
                    tested_draws += prefixes[prefix]
                    by_depth[depth + 1] += 1
        if on_progress:
            on_progress(1)
    chi_p = float(chi2.sf(statistic, degrees)) if degrees else 1.0
    ks_p = float(kstest(pit, "uniform").pvalue) if pit else 1.0
    status, reason = "tested", None
    if not degrees:
        status = "inconclusive"
        reason = (f"no prefix was drawn {MIN_GROUP} times or more ({per_prompt} draws on each of {len(prompts)} "
                  f"prompts), so no token could be tested against the target's distribution; set "
                  f"validation.sampling_draws to at least {MIN_GROUP * len(prompts)} "
                  f"({MIN_GROUP} per prompt), {10 * MIN_GROUP * len(prompts)} to test later tokens too")
    return {
        "status": status, "reason": reason,
        "test": f"first {tokens} sampled tokens of {per_prompt} draws on each of {len(prompts)} prompts against the "
                "target's exact distribution given their prefix: chi-square over prefixes drawn >= "
                f"{MIN_GROUP} times (cells expected < 5 pooled) and KS uniformity of the randomised PIT of every "
                "speculatively drawn token; p = 2 x the smaller p-value (Bonferroni)",
        "p_value": min(1.0, 2 * min(chi_p, ks_p)), "chi_square_p": chi_p, "pit_ks_p": ks_p,
        "statistic": round(statistic, 2), "degrees_of_freedom": degrees, "pit_tokens": len(pit),
        "draws": per_prompt * len(prompts), "prompts": len(prompts), "groups": groups,
        "groups_by_position": dict(by_depth), "cells": degrees + groups, "tested_tokens": tested_draws,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
    }
