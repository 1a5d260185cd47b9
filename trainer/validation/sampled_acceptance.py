"""Acceptance under speculative *sampling*, measured with the real decoder, and the figures report.json keeps of
acceptance at T=0 and at the job's own sampling parameters.

Greedy acceptance can be replayed against the target's known output (trainer/validation/replay.py); sampled
acceptance cannot: each accepted token changes what the target sees next, and a rejection draws from the residual
instead of the target's argmax. So the sampled figure runs `SpeculativeDecoder` with the job's SamplingParams
(temperature, top-p, top-k): rejection sampling against the target's distribution, one seeded generator per prompt
(`seed + index`), so two drafters measured on the same prompts see the same seeds and can be compared pairwise
(`bootstrap_interval(per_prompt, baseline)`). A greedy job's sampled figure *is* its greedy one: validation
records it once and says so (`same_as_greedy`) rather than decoding the prompts twice.

The interval is a percentile bootstrap over prompts (the unit that is independent), seeded, so a report is
reproducible to the digit: trainer/bootstrap.py, the one resampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from schemas.sampling import SamplingParams
from trainer.bootstrap import bootstrap_interval, paired_ratio_interval
from trainer.confidence import acceptance_pairs
from trainer.data.prompts import Prompt
from trainer.drafter.model import Drafter
from trainer.sampling import seeded_generator
from trainer.speculative import SpeculativeDecoder
from trainer.targets.loading import Target
from trainer.validation import served_prompt_ids
from trainer.validation.acceptance import CategoryStats

SPECULATIVE_SAMPLING = ("speculative sampling at the job's parameters: the real decoder, rejection sampling against "
                        "the target (trainer/validation/sampled_acceptance.py)")
GREEDY_REPLAY = "replay of the target's greedy output (trainer/validation/replay.py)"

@dataclass
class MeasuredAcceptance:
    """Acceptance over a set of prompts: the statistics by position and category, and per prompt (tokens emitted,
    cycles), the unit a bootstrap resamples."""

    stats: CategoryStats
    per_prompt: list[tuple[int, int]] = field(default_factory=list)
    confidence_pairs: list[tuple[list[float], list[bool]]] = field(default_factory=list)
    """Per prompt, the (score, accepted) pairs of the positions its cycles reached (trainer/confidence.py
    `acceptance_pairs`; empty where the cycles carry no scores): what a confidence map is fitted on."""

    def add(self, category: str, tokens: list[int], cycles: list) -> None:
        self.stats.add(category, tokens, cycles)
        self.per_prompt.append((sum(c.emitted for c in cycles), len(cycles)))
        self.confidence_pairs.append(acceptance_pairs(cycles))

    @property
    def tau(self) -> float:
        return self.stats.overall.tau


@torch.inference_mode()
def sampled_acceptance(target: Target, drafter: Drafter, prompts: list[Prompt], params: SamplingParams, *,
                       rendered: list[list[int]] | None = None, block_size: int | None = None,
                       on_each: Callable[[int], None] | None = None) -> MeasuredAcceptance:
    """Speculative sampling of every prompt at `params` (its temperature, top-p, top-k, max_new_tokens; prompt i
    seeded `params.seed + i`). `rendered`: the prompts' token ids when the caller has them; `on_each(i)` follows
    prompt i (a caller's progress and cancel poll)."""
    decoder = SpeculativeDecoder(target, drafter.eval(), block_size)
    if rendered is None:
        rendered = served_prompt_ids(target, prompts, params)
    measured = MeasuredAcceptance(CategoryStats(decoder.block_size))
    for index, (prompt, ids) in enumerate(zip(prompts, rendered, strict=True)):
        got = decoder.generate(ids, params, generator=seeded_generator(params.seed + index, target.device))
        measured.add(prompt.category, got.tokens, got.cycles)
        if on_each:
            on_each(index)
    return measured


def tau_figure(per_prompt: list[tuple[int, int]], params: SamplingParams, *, block_size: int, measured_by: str,
               seed: int | None = None) -> dict:
    """report.json's figure of one measurement (schemas/validation_report.py `TauAtTemperature`): tau over all
    prompts, its seeded 95 % bootstrap interval, and what it was measured at."""
    seed = params.seed if seed is None else seed
    emitted, cycles = sum(e for e, _ in per_prompt), sum(c for _, c in per_prompt)
    low, high = bootstrap_interval(per_prompt, seed=seed) if per_prompt else (None, None)
    return {
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
        "tau": round(emitted / max(1, cycles), 4),
        "ci95": None if low is None else [round(low, 4), round(high, 4)],
        "prompts": len(per_prompt), "tokens": emitted, "cycles": cycles, "block_size": block_size, "seed": seed,
        "measured_by": measured_by,
    }


def tau_figures(greedy: list[tuple[int, int]], sampled: list[tuple[int, int]] | None, params: SamplingParams, *,
                block_size: int) -> dict[str, dict]:
    """report.json's `tau_greedy` (at T=0) and `tau_sampled` (at the job's parameters) from per-prompt (emitted,
    cycles). `sampled` None: the job is greedy, and its figure at its own temperature is the T=0 one, marked
    `same_as_greedy` (measured once)."""
    at_zero = params.model_copy(update={"temperature": 0.0, "top_p": 1.0, "top_k": 0})  # no filter acts at T=0
    greedy_figure = tau_figure(greedy, at_zero, block_size=block_size, measured_by=GREEDY_REPLAY)
    if sampled is None:
        same = {**greedy_figure, "same_as_greedy": True,
                "measured_by": "the job is greedy (temperature 0): the T=0 figure, not measured twice"}
        return {"tau_greedy": greedy_figure, "tau_sampled": same}
    sampled_figure = tau_figure(sampled, params, block_size=block_size, measured_by=SPECULATIVE_SAMPLING)
    return {"tau_greedy": greedy_figure, "tau_sampled": {**sampled_figure, "same_as_greedy": False}}


def paired_gain(new: list[tuple[int, int]], parent: list[tuple[int, int]], *, temperature: float,
                seed: int) -> dict:
    """report.json's `warm_start.gain_*` (schemas/validation_report.py `PairedGain`): the new drafter against its
    parent, measured on the same prompts with the same seeds, as tau(new) / tau(parent) with its paired 95 %
    bootstrap interval, and the difference with its own."""
    tau_new = sum(e for e, _ in new) / max(1, sum(c for _, c in new))
    tau_parent = sum(e for e, _ in parent) / max(1, sum(c for _, c in parent))
    ratio_low, ratio_high = paired_ratio_interval(new, parent, seed=seed)
    low, high = bootstrap_interval(new, parent, seed=seed)
    return {"temperature": temperature, "parent_tau": round(tau_parent, 4), "tau": round(tau_new, 4),
            "ratio": round(tau_new / tau_parent, 4), "ci95": [round(ratio_low, 4), round(ratio_high, 4)],
            "difference": round(tau_new - tau_parent, 4), "difference_ci95": [round(low, 4), round(high, 4)],
            "prompts": len(new), "seed": seed}


def advice_from_gain(gain: dict) -> tuple[str, str]:
    """(advice, why): serve the new drafter only when the paired gain's interval lies above 1; otherwise this job
    has not shown it beats its parent, and the parent keeps serving."""
    low, high = gain["ci95"]
    at = "T=0" if gain["temperature"] == 0 else f"T={gain['temperature']:g}"
    figures = (f"tau {gain['tau']:.3f} vs the parent's {gain['parent_tau']:.3f} at {at}, ratio {gain['ratio']:.3f} "
               f"[{low:.3f}, {high:.3f}] over {gain['prompts']} held-out prompts")
    if low > 1.0:
        return "serve_new", f"the new drafter beats its parent: {figures}"
    return "keep_parent", (f"keep serving the parent: the gain's 95 % interval does not lie above 1 ({figures}); "
                           "train longer or on more of the fine-tune's traces to show a gain")


def parent_comparison(new_greedy: MeasuredAcceptance, new_sampled: MeasuredAcceptance | None,
                      parent_greedy: MeasuredAcceptance, parent_sampled: MeasuredAcceptance | None,
                      params: SamplingParams, *, block_size: int, parent_block_size: int | None = None) -> dict:
    """report.json's `warm_start` from the new drafter's and its parent's acceptance on the same prompts, at T=0
    and (a sampling job) at the job's own parameters, with the same seeds: each one's tau with its interval, the
    paired gains, and which drafter to serve (decided at the job's own parameters, the ones it serves at). Each drafts
    at its own block size (`parent_block_size`: the parent's, when a warm start changed it)."""
    new_figures = tau_figures(new_greedy.per_prompt, None if new_sampled is None else new_sampled.per_prompt, params,
                              block_size=block_size)
    parent_figures = tau_figures(parent_greedy.per_prompt, None if parent_sampled is None else parent_sampled.per_prompt,
                                 params, block_size=parent_block_size or block_size)
    gain_greedy = paired_gain(new_greedy.per_prompt, parent_greedy.per_prompt, temperature=0.0, seed=params.seed)
    gain_sampled = (gain_greedy if new_sampled is None or parent_sampled is None else
                    paired_gain(new_sampled.per_prompt, parent_sampled.per_prompt, temperature=params.temperature,
                                seed=params.seed))
    advice, reason = advice_from_gain(gain_sampled)
    headline = (parent_sampled or parent_greedy).stats.overall
    return {
        "parent_tau": round(headline.tau, 4),
        "parent_tau_per_position": [None if a is None else round(a, 4) for a in headline.per_position],
        "parent_acceptance_by_category": (parent_sampled or parent_greedy).stats.acceptance_by_category(),
        "tau": round((new_sampled or new_greedy).tau, 4), "gain_over_parent": gain_sampled["difference"],
        "prompts": len(new_greedy.per_prompt),
        "parent_tau_greedy": parent_figures["tau_greedy"], "parent_tau_sampled": parent_figures["tau_sampled"],
        "tau_greedy": new_figures["tau_greedy"], "tau_sampled": new_figures["tau_sampled"],
        "gain_greedy": gain_greedy, "gain_sampled": gain_sampled, "advice": advice, "advice_reason": reason,
    }
