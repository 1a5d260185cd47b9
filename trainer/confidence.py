"""A drafter's calibrated confidence: a map from its per-position score to the probability that the target accepts
that position, given that every earlier position of the cycle was accepted, and the draft length it drives.

The score (`Drafter.confidence`) is the DFlash 2 selector's top-1 probability after the walked predecessor, or a
DFlash drafter's top-1 token probability. It ranks positions well but is no probability of acceptance: the drafter
was trained to imitate the target, not to know when it fails. Validation pairs each reached position's score with
whether it was accepted (`acceptance_pairs`, from the held-out replay's cycles, no extra target pass) and fits a
monotone map by isotonic regression (pool adjacent violators): no parametric shape to get wrong, and a monotone map
keeps the score's ranking, so its AUC is the score's. The map ships as knots interpolated linearly (`ConfidenceMap`),
which any engine can evaluate with a few lines.

`VerifyLength` is the decoder's confidence-driven draft length: after drafting a whole block, verify drafts 1..n,
adding draft k while the expected gain (the product of calibrated acceptances up to k, and of k's for the drafts after
it) pays for the measured cost of verifying more tokens. It stops at the first draft that does not pay, reading no
later score: that is what keeps speculative sampling exact (trainer/speculative.py).

Torch-free (numpy, scipy), so the report and the bench read it cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from schemas.recipe import CONFIDENCE_BINS, CONFIDENCE_MAX_KNOTS

METHOD = "isotonic regression (pool adjacent violators), knots interpolated linearly, clamped at the ends"


@dataclass(frozen=True)
class ConfidenceMap:
    """Score -> P(accepted | earlier positions accepted), piecewise linear through `knots` (scores strictly rising,
    acceptance non-decreasing), constant beyond the first and last knot."""

    scores: tuple[float, ...]
    acceptance: tuple[float, ...]

    def __call__(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(scores, dtype=float), self.scores, self.acceptance)

    def to_json(self) -> dict:
        return {"method": METHOD, "score": [round(v, 6) for v in self.scores],
                "acceptance": [round(v, 6) for v in self.acceptance]}

    @classmethod
    def from_json(cls, data: Mapping) -> ConfidenceMap:
        return cls(tuple(map(float, data["score"])), tuple(map(float, data["acceptance"])))


def fit_isotonic(scores: Sequence[float], accepted: Sequence[bool | int],
                 max_knots: int = CONFIDENCE_MAX_KNOTS) -> ConfidenceMap:
    """The least-squares non-decreasing fit of `accepted` on `scores` (equal scores pooled first, so a tie cannot
    be split), as at most `max_knots` knots: one per pooled block at its mean score and mean acceptance."""
    x, y = np.asarray(scores, dtype=float), np.asarray(accepted, dtype=float)
    if len(x) == 0:
        raise ValueError("no (score, accepted) pairs to fit a confidence map on")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    unique, start = np.unique(x, return_index=True)
    weight = np.diff(np.append(start, len(x))).astype(float)
    total = np.add.reduceat(y, start)
    # Pool adjacent violators over the tie groups: a stack of blocks (sum of y, weight, sum of x).
    blocks: list[list[float]] = []
    for value, w, s in zip(unique, weight, total, strict=True):
        blocks.append([s, w, value * w])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s2, w2, x2 = blocks.pop()
            blocks[-1] = [blocks[-1][0] + s2, blocks[-1][1] + w2, blocks[-1][2] + x2]
    sums = np.array(blocks)
    if len(sums) > max_knots:
        # Consecutive blocks pooled by weight into max_knots groups: a weighted mean of consecutive non-decreasing
        # means, so the pooled map stays monotone.
        cumulative = np.cumsum(sums[:, 1])
        group = np.minimum((cumulative - sums[:, 1] / 2) * max_knots // cumulative[-1], max_knots - 1).astype(int)
        sums = np.array([sums[group == g].sum(axis=0) for g in np.unique(group)])
    return ConfidenceMap(tuple(sums[:, 2] / sums[:, 1]), tuple(sums[:, 0] / sums[:, 1]))


def auc(scores: Sequence[float], accepted: Sequence[bool | int]) -> float | None:
    """Area under the ROC curve: P(score of an accepted position > score of a rejected one), ties counting half
    (Mann-Whitney U from average ranks). None when either class is empty."""
    x, y = np.asarray(scores, dtype=float), np.asarray(accepted, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return None
    ranks = rankdata(x)
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def expected_calibration_error(predicted: Sequence[float], accepted: Sequence[bool | int],
                               bins: int = CONFIDENCE_BINS) -> float:
    """Sum over equal-width bins of predicted probability of (share of positions in the bin) x |mean predicted -
    share accepted|."""
    p, y = np.asarray(predicted, dtype=float), np.asarray(accepted, dtype=float)
    index = np.minimum((p * bins).astype(int), bins - 1)
    error = 0.0
    for b in np.unique(index):
        inside = index == b
        error += inside.sum() / len(p) * abs(p[inside].mean() - y[inside].mean())
    return float(error)


def acceptance_pairs(cycles: Iterable) -> tuple[list[float], list[bool]]:
    """(score, accepted) of every position a cycle reached: draft k of a cycle whose drafts 1..k-1 were all
    accepted, so the label is the conditional acceptance the map predicts. Cycles without scores add nothing."""
    scores, accepted = [], []
    for cycle in cycles:
        if cycle.scores is None:
            continue
        for k in range(1, min(cycle.offered, cycle.accepted + 1) + 1):
            scores.append(cycle.scores[k - 1])
            accepted.append(k <= cycle.accepted)
    return scores, accepted


def cross_fitted_maps(per_prompt: Sequence[tuple[Sequence[float], Sequence[bool]]]) -> list[ConfidenceMap | None]:
    """For every prompt, the map fitted on the other half of the prompts (prompts alternate between two halves), so
    what is read on a prompt was not fitted on it. None where the other half has no pairs."""
    maps: list[ConfidenceMap | None] = []
    for half in (0, 1):
        fit_on = [pair for i, pair in enumerate(per_prompt) if i % 2 != half]
        scores = [s for prompt, _ in fit_on for s in prompt]
        maps.append(fit_isotonic(scores, [a for _, prompt in fit_on for a in prompt]) if scores else None)
    return [maps[i % 2] for i in range(len(per_prompt))]


def calibration_figures(per_prompt: Sequence[tuple[Sequence[float], Sequence[bool]]], score: str,
                        bins: int = CONFIDENCE_BINS) -> dict:
    """report.json's `confidence`: the map fitted on every prompt's pairs, the score's AUC, and the expected
    calibration error of the cross-fitted maps (`cross_fitted_maps`: a map's error on its own pairs flatters it),
    beside the raw score's own (read as a probability)."""
    scores = [s for prompt, _ in per_prompt for s in prompt]
    labels = [a for _, prompt in per_prompt for a in prompt]
    held_out_p: list[float] = []
    held_out_y: list[bool] = []
    for other, (prompt_scores, prompt_labels) in zip(cross_fitted_maps(per_prompt), per_prompt, strict=True):
        if other is not None and len(prompt_scores):
            held_out_p += list(other(prompt_scores))
            held_out_y += list(prompt_labels)
    score_auc = auc(scores, labels)
    return {
        "score": score, "positions": len(scores), "prompts": len(per_prompt),
        "acceptance_rate": round(float(np.mean(labels)), 4),
        "auc": None if score_auc is None else round(score_auc, 4),
        "ece": round(expected_calibration_error(held_out_p, held_out_y, bins), 4) if held_out_p else None,
        "ece_uncalibrated": round(expected_calibration_error(scores, labels, bins), 4),
        "ece_bins": bins,
        "ece_measured_by": "maps fitted on alternate prompts, each read on the prompts it was not fitted on",
        "map": fit_isotonic(scores, labels).to_json(),
    }


@dataclass(frozen=True)
class VerifyLength:
    """Choose how many drafts a cycle verifies from their calibrated acceptance and the measured costs:
    `draft_seconds` to draft the block (spent whatever is verified), `verify_seconds[w]` to verify w tokens
    (the anchor and w - 1 drafts; validation's step costs)."""

    confidence: ConfidenceMap
    draft_seconds: float
    verify_seconds: Mapping[int, float]

    def choose(self, scores: Sequence[float]) -> int:
        """Drafts to verify, 0..len(scores). Draft k is added while some length from k on would raise the expected
        tokens per second (expected tokens: 1 + the sum of survival products) over stopping before it, its later
        drafts assumed to be accepted as draft k is: their scores are not read (that would bias sampling, module
        docstring), and a one-draft look-ahead alone stops short where one more draft costs a fixed step (the taps a
        drafting verify captures) that several drafts would share. Stops at the first draft that fails."""
        survive, expected, offered = 1.0, 1.0, 0
        cost = self.draft_seconds + self.verify_seconds[1]
        for k, p in enumerate(self.confidence(scores), start=1):
            if k + 1 not in self.verify_seconds or not self._pays(k, float(p), len(scores), survive, expected, cost):
                break
            survive *= float(p)
            expected, cost, offered = expected + survive, self.draft_seconds + self.verify_seconds[k + 1], k
        return offered

    def _pays(self, k: int, p: float, drafted: int, survive: float, expected: float, cost: float) -> bool:
        """Whether verifying drafts k..m, for some m, beats stopping at k - 1 (drafts after k assumed accepted at p)."""
        extended = expected
        for m in range(k, drafted + 1):
            if m + 1 not in self.verify_seconds:
                break
            survive *= p
            extended += survive
            if extended * cost >= expected * (self.draft_seconds + self.verify_seconds[m + 1]):
                return True
        return False

    @classmethod
    def from_costs(cls, confidence: ConfidenceMap, costs: Mapping) -> VerifyLength:
        """From validation's `measure_step_costs` (seconds by block size): the block's draft cost and every
        width's verify cost."""
        draft = costs["draft"][max(costs["draft"])]
        return cls(confidence, draft, dict(costs["verify"]))
