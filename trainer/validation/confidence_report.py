"""report.json's `confidence`: the drafter's calibrated confidence, fitted on validation's held-out cycles, and the
adaptive-length row (the decoder's confidence-driven draft length against the fixed recommended block).

The (score, accepted) pairs come from the T = 0 replay validation already runs (trainer/validation/report.py
`measure_acceptance`): no target pass is added for the map, its AUC or its calibration error (trainer/confidence.py).
The adaptive row replays the held-out prompts twice more, drafter only: at the recommended fixed block and with the
adaptive length, each prompt's length chosen by the map fitted on the *other* half of the prompts, so the row is not
read on the pairs its map was fitted on. The target runs once per prompt to give the replay its taps (a forward over
prompt and answer, no decoding). Seconds are the step costs validation measured (`measure_step_costs`: draft a block,
verify w tokens), so tokens/s here is an estimate on the validation machine; bench/adaptive_length.py measures the
decoder itself, timed.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.bootstrap import paired_ratio_interval, ratio_of_sums
from trainer.confidence import VerifyLength, calibration_figures, cross_fitted_maps
from trainer.data.prompts import Prompt
from trainer.drafter.model import Drafter
from trainer.speculative import Cycle, SpeculativeDecoder
from trainer.targets.loading import Target
from trainer.validation.replay import reference_of, replay_greedy
from trainer.validation.sampled_acceptance import MeasuredAcceptance

SELECTOR_SCORE = "the DFlash 2 selector's top-1 probability (temperature 1) after the walked predecessor"
DRAFTER_SCORE = "the drafter's top-1 token probability (temperature 1)"
ADAPTIVE_MEASURED_BY = ("greedy replay of the held-out prompts (drafter only), each prompt's length chosen by the map "
                        "fitted on the other half of the prompts; seconds from step_costs_ms")


def score_name(drafter: Drafter) -> str:
    return SELECTOR_SCORE if drafter.candidate_selector is not None else DRAFTER_SCORE


def confidence_figures(target: Target, drafter: Drafter, prompts: list[Prompt], rendered: list[list[int]],
                       references: list[list[int]], at_zero: MeasuredAcceptance, costs: Mapping,
                       recommended: int, max_new_tokens: int) -> dict | None:
    """report.json's `confidence` (schemas/confidence.py), or None when the replay reached no position (nothing
    to fit on)."""
    pairs = at_zero.confidence_pairs
    if not any(scores for scores, _ in pairs):
        return None
    figures = calibration_figures(pairs, score_name(drafter))
    row = adaptive_row(target, drafter, prompts, rendered, references, pairs, costs, recommended, max_new_tokens)
    return figures if row is None else {**figures, "adaptive_length": row}


def adaptive_row(target: Target, drafter: Drafter, prompts: list[Prompt], rendered: list[list[int]],
                 references: list[list[int]], pairs: list, costs: Mapping, recommended: int,
                 max_new_tokens: int) -> dict | None:
    """The adaptive length against the fixed `recommended` block on the same prompts, paired per prompt (module
    docstring: how). None when no prompt has a map fitted on others (a single prompt) or no cycle was run."""
    taps = list(drafter.config.target_layer_ids)
    fixed_decoder = SpeculativeDecoder(target, drafter, block_size=recommended)
    adaptive_tau: list[tuple[float, float]] = []
    fixed_tau: list[tuple[float, float]] = []
    adaptive_speed: list[tuple[float, float]] = []  # (tokens, seconds at the step costs) per prompt
    fixed_speed: list[tuple[float, float]] = []
    verified: list[int] = []
    for prompt, ids, response, confidence in zip(prompts, rendered, references, cross_fitted_maps(pairs),
                                                 strict=True):
        if confidence is None:
            continue
        reference = reference_of(target, prompt, ids, response, max_new_tokens, taps)
        adaptive = SpeculativeDecoder(target, drafter, verify_length=VerifyLength.from_costs(confidence, costs))
        for decoder, tau, speed in ((fixed_decoder, fixed_tau, fixed_speed), (adaptive, adaptive_tau, adaptive_speed)):
            cycles = replay_greedy(target, drafter, reference, decoder=decoder)
            emitted = sum(c.emitted for c in cycles)
            tau.append((emitted, len(cycles)))
            speed.append((emitted, cycle_seconds(cycles, costs, decoder.block_size)))
        verified += [c.offered for c in cycles]  # the adaptive decoder's, the last of the two
    if not ratio_of_sums(fixed_tau) or not ratio_of_sums(adaptive_tau):
        return None
    step = costs["verify"][1]  # the target alone commits one token per decode step

    def speedup(rows: list) -> float:
        return round(ratio_of_sums(rows) * step, 3)

    return {
        "measured_by": ADAPTIVE_MEASURED_BY, "fixed_block_size": recommended,
        "tau": round(ratio_of_sums(adaptive_tau), 4), "tau_fixed": round(ratio_of_sums(fixed_tau), 4),
        "tau_ratio": round(ratio_of_sums(adaptive_tau) / ratio_of_sums(fixed_tau), 4),
        "tau_ratio_ci95": [round(v, 4) for v in paired_ratio_interval(adaptive_tau, fixed_tau)],
        "mean_verified_drafts": round(sum(verified) / max(len(verified), 1), 3),
        "estimated_speedup": speedup(adaptive_speed), "estimated_speedup_fixed": speedup(fixed_speed),
        "speed_ratio": round(ratio_of_sums(adaptive_speed) / ratio_of_sums(fixed_speed), 4),
        "speed_ratio_ci95": [round(v, 4) for v in paired_ratio_interval(adaptive_speed, fixed_speed)],
    }


def cycle_seconds(cycles: list[Cycle], costs: Mapping, block_size: int) -> float:
    """Seconds the cycles cost at the measured step costs: each drafts a block of `block_size` and verifies its
    anchor and the drafts it offered."""
    return sum(costs["draft"][block_size] + costs["verify"][c.offered + 1] for c in cycles)
