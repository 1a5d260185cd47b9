"""`draftsmith validate`: prove a drafter lossless on held-out prompts and measure what it buys.

For every validation prompt the target decodes alone and speculatively, side by side (greedy): outputs
must match token for token (any mismatch fails, with the first diverging position recorded), and the
two timings give the speedup on this machine. Acceptance is measured at the job's sampling parameters.
A chi-square test checks speculative sampling against the target's exact distribution. The report
also recommends a block size from the measured acceptance and the measured cost of verifying b tokens.
"""

from __future__ import annotations

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
from trainer.validation import SAMPLING_DRAWS, VALIDATION_MAX_NEW_TOKENS
from trainer.validation.acceptance import AcceptanceStats, CategoryStats
from trainer.validation.sampling_test import sampling_lossless_test

SAMPLING_ALPHA = 1e-3


class ValidationFailed(DraftsmithError):
    """The drafter changed the target's output: never publish it."""


def check_compatible(target: Target, drafter: Drafter) -> None:
    """Refuse a drafter built for another target, naming what differs."""
    c = drafter.config
    problems = []
    if c.hidden_size != target.hidden_size:
        problems.append(f"hidden size {c.hidden_size} != target's {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {c.vocab_size} != target's {target.vocab_size}")
    if c.num_target_layers != target.num_layers or max(c.target_layer_ids) >= target.num_layers - 1:
        problems.append(f"taps layers {list(c.target_layer_ids)} of a {c.num_target_layers}-layer target; "
                        f"this target has {target.num_layers} layers")
    if not problems and c.target_fingerprint and c.target_fingerprint != target.fingerprint:
        problems.append(f"target fingerprint {c.target_fingerprint} != {target.fingerprint} "
                        "(different tokenizer or embedding)")
    if problems:
        raise DraftsmithError("the drafter was built for another target: " + "; ".join(problems))


def validate(target: Target, drafter: Drafter, prompts: list[Prompt], params: SamplingParams, *,
             max_new_tokens: int = VALIDATION_MAX_NEW_TOKENS, sampling_draws: int = SAMPLING_DRAWS,
             on_progress: Callable[[int, int], None] | None = None) -> dict:
    check_compatible(target, drafter)
    block_size = drafter.config.block_size
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    serving = params.model_copy(update={"max_new_tokens": max_new_tokens})
    plain = SpeculativeDecoder(target)
    speculative = SpeculativeDecoder(target, drafter, record_candidates=params.greedy)
    stats = CategoryStats(block_size)
    mismatches, first_divergence = 0, None
    ar_time = ar_tokens = spec_time = spec_tokens = 0
    for index, prompt in enumerate(prompts):
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template)
        expected = plain.generate(ids, greedy)
        got = speculative.generate(ids, greedy)
        ar_time += expected.prefill_seconds + expected.decode_seconds
        spec_time += got.prefill_seconds + got.decode_seconds
        ar_tokens, spec_tokens = ar_tokens + len(expected.tokens), spec_tokens + len(got.tokens)
        if got.tokens != expected.tokens:
            mismatches += 1
            if first_divergence is None:
                position = next((i for i, (a, b) in enumerate(zip(got.tokens, expected.tokens)) if a != b),
                                min(len(got.tokens), len(expected.tokens)))
                first_divergence = {"prompt_id": prompt.id, "position": position,
                                    "expected": expected.tokens[position:position + 5],
                                    "got": got.tokens[position:position + 5]}
        if not params.greedy:  # acceptance at the serving temperature
            got = speculative.generate(ids, serving, generator=torch.Generator().manual_seed(params.seed + index))
        stats.add(prompt.category, got.tokens, got.cycles)
        if on_progress:
            on_progress(index + 1, len(prompts))

    sampling_params = params if not params.greedy else params.model_copy(update={"temperature": 1.0})
    first_ids = render_prompt(target.tokenizer, list(prompts[0].messages), params.chat_template)
    sampling = sampling_lossless_test(speculative, first_ids, sampling_params, draws=sampling_draws, seed=params.seed)
    costs = measure_step_costs(target, drafter, first_ids)
    expected_tau = {b: round(stats.overall.expected_tau(b), 4) for b in range(2, block_size + 1)}
    speedups = {b: expected_tau[b] * costs["verify"][1] / (costs["verify"][b] + costs["draft"]) for b in expected_tau}
    overall: AcceptanceStats = stats.overall
    report = {
        "passed": mismatches == 0 and sampling["p_value"] >= SAMPLING_ALPHA,
        "block_size": block_size,
        "tau": round(overall.tau, 4),
        "tau_per_position": [None if a is None else round(a, 4) for a in overall.per_position],
        "acceptance_by_category": stats.acceptance_by_category(),
        "oracle_tau": None if overall.oracle_tau is None else round(overall.oracle_tau, 4),
        "cycles": overall.cycles,
        "expected_tau_by_block_size": expected_tau,
        "recommended_block_size": max(speedups, key=speedups.get),
        "estimated_speedup_by_block_size": {b: round(v, 3) for b, v in speedups.items()},
        "lossless": {
            "greedy": {"prompts": len(prompts), "mismatches": mismatches, "first_divergence": first_divergence},
            "sampling": {**sampling, "alpha": SAMPLING_ALPHA, "passed": sampling["p_value"] >= SAMPLING_ALPHA},
        },
        "speedup": {
            "decoding": "greedy, batch 1, measured side by side on this machine",
            "ar_tokens_per_s": round(ar_tokens / ar_time, 2), "spec_tokens_per_s": round(spec_tokens / spec_time, 2),
            "ratio": round((spec_tokens / spec_time) / (ar_tokens / ar_time), 3),
        },
        "sampling_parameters": params.model_dump(mode="json"),
        "validation_max_new_tokens": max_new_tokens,
        "target_fingerprint": target.fingerprint,
    }
    return report


@torch.inference_mode()
def measure_step_costs(target: Target, drafter: Drafter, prompt: list[int], repeats: int = 3) -> dict:
    """Seconds to verify b tokens after the prompt (b = 1 is a plain decode step), and one drafting pass."""
    device, block = target.device, drafter.config.block_size
    cache = target.new_cache()
    _, context = target.forward(torch.tensor([prompt], device=device), cache=cache,
                                tap_layer_ids=list(drafter.config.target_layer_ids))
    verify = {}
    for b in range(1, block + 1):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            target.forward(torch.full((1, b), 5, device=device),
                           torch.arange(len(prompt), len(prompt) + b, device=device)[None], cache=cache)
            times.append(time.perf_counter() - started)
            target.crop_cache(cache, len(prompt))
        verify[b] = statistics.median(times)
    times = []
    positions = torch.arange(len(prompt), len(prompt) + block, device=device)[None]
    noise = drafter.embed_block(torch.full((1, block), drafter.config.mask_token_id, device=device),
                                target.embedding_weight)
    for _ in range(repeats):
        started = time.perf_counter()
        hidden = drafter(noise, positions, context, torch.arange(len(prompt), device=device)[None],
                         cache=DrafterCache(drafter.config.num_layers))
        target.lm_head(hidden)
        times.append(time.perf_counter() - started)
    return {"verify": verify, "draft": statistics.median(times)}


def require_passed(report: dict) -> None:
    greedy = report["lossless"]["greedy"]
    if greedy["mismatches"]:
        raise ValidationFailed(f"speculative output differs from the target's on {greedy['mismatches']} of "
                               f"{greedy['prompts']} prompts (first at {greedy['first_divergence']})")
    sampling = report["lossless"]["sampling"]
    if not sampling["passed"]:
        raise ValidationFailed(f"speculative sampling failed the distribution test (p = {sampling['p_value']:.2e})")
