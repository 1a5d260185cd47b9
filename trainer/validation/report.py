"""`draftsmith validate`: prove a drafter lossless on held-out prompts and measure what it buys.

The target decodes every validation prompt alone. Acceptance at the trained block size is measured on that
output (greedy jobs: by replaying the drafter against it, trainer/validation/replay.py; sampling
jobs: by speculative sampling). The draft cost and the verify cost of every draft length, measured
separately, and the per-position acceptance give the recommended draft length; speculative decoding at
that length then runs on every prompt, timed back to back with the target alone (the measured speedup),
and its greedy output must equal the target's token for token (any mismatch fails, with the first
diverging position recorded). A statistical test checks speculative sampling at that length against the
target's exact distribution (trainer/validation/sampling_test.py).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

from schemas.sampling import SamplingParams
from trainer.data.prompts import Prompt
from trainer.drafter.model import Drafter, DrafterCache
from trainer.errors import DraftsmithError
from trainer.speculative import SpeculativeDecoder
from trainer.targets.chat import render_prompt
from trainer.targets.loading import Target
from trainer.validation import SAMPLING_DRAWS, SAMPLING_PROMPTS, VALIDATION_MAX_NEW_TOKENS
from trainer.validation.acceptance import AcceptanceStats, CategoryStats
from trainer.validation.replay import GreedyReference, replay_greedy
from trainer.validation.sampling_test import sampling_lossless_test

SAMPLING_ALPHA = 1e-3


class ValidationFailed(DraftsmithError):
    """The drafter changed the target's output: never publish it."""

    code = "not_lossless"


def check_compatible(target: Target, drafter: Drafter) -> None:
    """Refuse a drafter built for another target, naming what differs."""
    c = drafter.config
    problems = []
    if c.hidden_size != target.hidden_size:
        problems.append(f"hidden size {c.hidden_size} != target's {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {c.vocab_size} != target's {target.vocab_size}")
    if c.num_target_layers != target.num_layers or max(c.target_layer_ids) >= target.num_layers:
        problems.append(f"taps layers {list(c.target_layer_ids)} of a {c.num_target_layers}-layer target; "
                        f"this target has {target.num_layers} layers")
    if not problems and c.target_fingerprint and c.target_fingerprint != target.fingerprint:
        problems.append(f"target fingerprint {c.target_fingerprint} != {target.fingerprint} "
                        "(different tokenizer or embedding)")
    if problems:
        raise DraftsmithError("the drafter was built for another target: " + "; ".join(problems))


def validate(target: Target, drafter: Drafter, prompts: list[Prompt], params: SamplingParams, *,
             max_new_tokens: int = VALIDATION_MAX_NEW_TOKENS, sampling_draws: int = SAMPLING_DRAWS,
             sampling_prompts: int = SAMPLING_PROMPTS,
             on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Three passes over the prompts: (1) the target alone, timed, and acceptance at the trained block size
    (replayed against its output for greedy jobs, sampled with the real decoder otherwise); then the draft and
    verify costs per draft length, which with the acceptance give the recommended draft length; (2) speculative
    decoding at that length, timed, whose greedy output must equal the target's token for token; (3) the
    sampling test at that length."""
    check_compatible(target, drafter)
    block_size = drafter.config.block_size
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    serving = params.model_copy(update={"max_new_tokens": max_new_tokens})
    plain = SpeculativeDecoder(target)
    full_block = SpeculativeDecoder(target, drafter, record_candidates=params.greedy)
    taps = list(drafter.config.target_layer_ids)
    stats = CategoryStats(block_size)
    total = 2 * len(prompts) + 1
    rendered, expected_tokens = [], []
    for index, prompt in enumerate(prompts):
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template)
        expected = plain.generate(ids, greedy)
        rendered.append(ids)
        expected_tokens.append(expected.tokens)
        if params.greedy:
            _, context = target.forward(torch.tensor([ids + expected.tokens], device=target.device), tap_layer_ids=taps)
            reference = GreedyReference(prompt.id, prompt.category, len(ids), ids + expected.tokens, max_new_tokens,
                                        context[0].float().cpu(), tuple(taps))
            stats.add(prompt.category, expected.tokens, replay_greedy(target, drafter, reference, decoder=full_block))
        else:  # acceptance at the serving temperature
            got = full_block.generate(ids, serving, generator=torch.Generator().manual_seed(params.seed + index))
            stats.add(prompt.category, got.tokens, got.cycles)
        if on_progress:
            on_progress(index + 1, total)

    overall: AcceptanceStats = stats.overall
    costs = measure_step_costs(target, drafter, rendered[0])
    expected_tau = {b: round(overall.expected_tau(b), 4) for b in range(2, block_size + 1)}
    speedups = {b: expected_tau[b] * costs["verify"][1] / (costs["draft"][b] + costs["verify"][b])
                for b in expected_tau}
    recommended = max(speedups, key=speedups.get)

    # Speculative decoding at the recommended draft length: lossless, and how fast. The target alone is
    # timed again right before it on the same prompt, so both see the same machine load.
    served = SpeculativeDecoder(target, drafter, block_size=recommended)
    served_stats = AcceptanceStats(recommended)
    mismatches, first_divergence = 0, None
    ar_time = ar_tokens = spec_time = spec_tokens = 0
    load_before = os.getloadavg()[0]
    for index, (prompt, ids, expected) in enumerate(zip(prompts, rendered, expected_tokens, strict=True)):
        alone = plain.generate(ids, greedy)
        ar_time += alone.prefill_seconds + alone.decode_seconds
        ar_tokens += len(alone.tokens)
        got = served.generate(ids, greedy)
        spec_time += got.prefill_seconds + got.decode_seconds
        spec_tokens += len(got.tokens)
        served_stats.add(got.tokens, got.cycles)
        if got.tokens != expected:
            mismatches += 1
            if first_divergence is None:
                position = next((i for i, (a, b) in enumerate(zip(got.tokens, expected)) if a != b),
                                min(len(got.tokens), len(expected)))
                first_divergence = {"prompt_id": prompt.id, "position": position,
                                    "expected": expected[position:position + 5], "got": got.tokens[position:position + 5]}
        if on_progress:
            on_progress(len(prompts) + index + 1, total)
    load_after = os.getloadavg()[0]

    sampling_params = params if not params.greedy else params.model_copy(update={"temperature": 1.0})
    sampling = sampling_lossless_test(served, rendered[:sampling_prompts], sampling_params, draws=sampling_draws,
                                      seed=params.seed)
    ar_rate, spec_rate = ar_tokens / ar_time, spec_tokens / spec_time
    report = {
        "passed": mismatches == 0 and sampling["p_value"] >= SAMPLING_ALPHA,
        "block_size": block_size,
        "tau": round(overall.tau, 4),
        "tau_per_position": [None if a is None else round(a, 4) for a in overall.per_position],
        "acceptance_by_category": stats.acceptance_by_category(),
        "oracle_tau": None if overall.oracle_tau is None else round(overall.oracle_tau, 4),
        "cycles": overall.cycles,
        "acceptance_measured_by": "replay of the target's greedy output (trainer/validation/replay.py)"
                                  if params.greedy else "speculative sampling at the job's parameters",
        "expected_tau_by_block_size": expected_tau,
        "recommended_block_size": recommended,
        "estimated_speedup_by_block_size": {b: round(v, 3) for b, v in speedups.items()},
        "step_costs_ms": {
            "verify": {b: round(v * 1000, 2) for b, v in costs["verify"].items()},
            "draft": {b: round(v * 1000, 2) for b, v in costs["draft"].items()},
            "draft_vocab_size": costs["draft_vocab_size"],
            "threads": torch.get_num_threads(),
        },
        "lossless": {
            "greedy": {"prompts": len(prompts), "block_size": recommended, "mismatches": mismatches,
                       "first_divergence": first_divergence},
            "sampling": {**sampling, "alpha": SAMPLING_ALPHA, "passed": sampling["p_value"] >= SAMPLING_ALPHA,
                         "block_size": recommended},
        },
        "speedup": {
            "decoding": f"greedy, batch 1, block size {recommended} (recommended), each prompt decoded by the "
                        "target alone then speculatively, back to back, on this machine",
            "block_size": recommended,
            "tau": round(served_stats.tau, 4),
            "ar_tokens_per_s": round(ar_rate, 2), "spec_tokens_per_s": round(spec_rate, 2),
            "ratio": round(spec_rate / ar_rate, 3),
            "load_average": [round(load_before, 2), round(load_after, 2)],
        },
        "sampling_parameters": params.model_dump(mode="json"),
        "validation_max_new_tokens": max_new_tokens,
        "target_fingerprint": target.fingerprint,
    }
    return report


@torch.inference_mode()
def measure_step_costs(target: Target, drafter: Drafter, prompt: list[int], repeats: int = 5) -> dict:
    """Seconds to verify b tokens after the prompt (b = 1 is a plain decode step; b > 1 also captures the
    taps, as a verify does) and to draft a block of b (b - 1 drafts: the drafter, its LM head over the draft
    vocabulary if it has one, the selector walk), each the median of `repeats` after a warm-up."""
    device, block = target.device, drafter.config.block_size
    taps = list(drafter.config.target_layer_ids)
    cache = target.new_cache()
    _, context = target.forward(torch.tensor([prompt], device=device), cache=cache, tap_layer_ids=taps)
    decoder = SpeculativeDecoder(target, drafter)
    greedy = SamplingParams(temperature=0.0)

    def median_seconds(run) -> float:
        run()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    def verify(b: int) -> None:
        target.forward(torch.full((1, b), 5, device=device), torch.arange(len(prompt), len(prompt) + b,
                       device=device)[None], cache=cache, tap_layer_ids=taps if b > 1 else None)
        target.crop_cache(cache, len(prompt))

    def draft(b: int) -> None:
        decoder._draft(5, len(prompt), b, context, 0, DrafterCache(drafter.config.num_layers), greedy, None)

    return {"verify": {b: median_seconds(lambda b=b: verify(b)) for b in range(1, block + 1)},
            "draft": {b: median_seconds(lambda b=b: draft(b)) for b in range(2, block + 1)},
            "draft_vocab_size": None if decoder.draft_vocab is None else len(decoder.draft_vocab)}


def require_passed(report: dict) -> None:
    greedy = report["lossless"]["greedy"]
    if greedy["mismatches"]:
        raise ValidationFailed(f"speculative output differs from the target's on {greedy['mismatches']} of "
                               f"{greedy['prompts']} prompts (first at {greedy['first_divergence']})")
    sampling = report["lossless"]["sampling"]
    if not sampling["passed"]:
        raise ValidationFailed(f"speculative sampling failed the distribution test (p = {sampling['p_value']:.2e})")
