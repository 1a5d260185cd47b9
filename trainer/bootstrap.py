"""The one resampler: percentile bootstrap intervals over prompts, for validation's report and the bench.

A prompt is the unit that is independent, so every interval here resamples prompts with replacement and reads
the statistic's percentiles over the draws (2.5 and 97.5 for the default 95 %). Each statistic is a ratio of
sums over the prompts: tau is total tokens emitted / total cycles, a speedup total seconds alone / total seconds
speculative. Two measurements on the same prompts are resampled together (paired), so a prompt's difficulty
cancels in their difference or ratio. `scipy.stats.bootstrap` draws the one-level intervals; the two-level one
(training seeds and prompts, `seed_pooled_ratio_interval`), which scipy does not offer, is drawn here with numpy.
Every interval is seeded, so a report is reproducible. Torch-free: the bench and the CLI read it cheaply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import bootstrap

Pairs = Sequence[tuple[float, float]] | Sequence[Sequence[float]]
"""(numerator, denominator) per prompt: (tokens emitted, cycles), or (seconds alone, seconds speculative)."""

DRAWS = 4000
LEVEL = 0.95


def ratio_of_sums(pairs: Pairs) -> float:
    """The sum of the first column over the sum of the second (tau of per-prompt (emitted, cycles))."""
    numerator, denominator = _columns(pairs)
    return float(_ratio(numerator, denominator, axis=-1))


def bootstrap_interval(
    per_prompt: Pairs, baseline: Pairs | None = None, draws: int = DRAWS, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap over prompts of tau (= total emitted / total cycles, or any ratio of sums), or, given a
    baseline measured on the same prompts, of the paired difference tau - tau_baseline."""
    if baseline is None:
        return _interval(_columns(per_prompt), _ratio, draws, level, seed)
    _check_paired(per_prompt, baseline)

    def difference(emitted, cycles, base_emitted, base_cycles, axis):
        return _ratio(emitted, cycles, axis) - _ratio(base_emitted, base_cycles, axis)

    return _interval((*_columns(per_prompt), *_columns(baseline)), difference, draws, level, seed)


def paired_ratio_interval(
    per_prompt: Pairs, baseline: Pairs, draws: int = DRAWS, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap of tau / tau_baseline, the two measured on the same prompts and resampled together (so
    a prompt's difficulty cancels in the ratio)."""
    _check_paired(per_prompt, baseline)

    def ratio(emitted, cycles, base_emitted, base_cycles, axis):
        return _ratio(emitted, cycles, axis) / _ratio(base_emitted, base_cycles, axis)

    return _interval((*_columns(per_prompt), *_columns(baseline)), ratio, draws, level, seed)


def seed_pooled_ratio_interval(
    runs: Sequence[Pairs], references: Sequence[Pairs], draws: int = DRAWS, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of tau(runs) / tau(references), each tau pooled over its training seeds, from a
    two-level bootstrap: each draw resamples the seeds of each side (independent runs) and the prompts (shared by
    both sides, so a prompt's difficulty cancels in the ratio). Every run holds per-prompt pairs of the same
    prompts."""
    mine, theirs = np.asarray(runs, dtype=float), np.asarray(references, dtype=float)  # (seeds, prompts, 2)
    if mine.ndim != 3 or theirs.ndim != 3 or mine.shape[1] != theirs.shape[1] or mine.shape[1] == 0:
        raise ValueError(f"a pooled ratio needs runs on the same prompts: {mine.shape} against {theirs.shape}")
    rng = np.random.default_rng(seed)
    count = mine.shape[1]
    # Resampling n of n with replacement is a multinomial draw of how often each one is picked.
    prompts = rng.multinomial(count, np.full(count, 1 / count), size=draws)

    def pooled_tau(side: np.ndarray) -> np.ndarray:
        seeds = rng.multinomial(len(side), np.full(len(side), 1 / len(side)), size=draws)
        totals = np.einsum("ds,spk,dp->dk", seeds, side, prompts)
        return _divide(totals[:, 0], totals[:, 1])

    ratios = pooled_tau(mine) / pooled_tau(theirs)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def _columns(pairs: Pairs) -> tuple[np.ndarray, np.ndarray]:
    array = np.asarray(pairs, dtype=float).reshape(-1, 2)
    return array[:, 0], array[:, 1]


def _ratio(numerator: np.ndarray, denominator: np.ndarray, axis: int) -> np.ndarray:
    """sum / sum along `axis`."""
    return _divide(np.sum(numerator, axis=axis), np.sum(denominator, axis=axis))


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """A zero denominator (no cycles at all) counts as one, so tau is then 0."""
    return numerator / np.where(denominator == 0, 1.0, denominator)


def _check_paired(per_prompt: Pairs, baseline: Pairs) -> None:
    if len(per_prompt) != len(baseline):
        raise ValueError(f"a paired interval needs the same prompts: {len(per_prompt)} != {len(baseline)}")


def _interval(
    columns: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], draws: int, level: float, seed: int
) -> tuple[float, float]:
    """scipy's paired percentile bootstrap of a vectorised statistic of per-prompt columns."""
    count = len(columns[0])
    if count == 0:
        raise ValueError("no prompts to resample")
    if count == 1:  # every resample is the one prompt (scipy asks for two)
        point = float(statistic(*columns, axis=-1))
        return point, point
    result = bootstrap(
        columns,
        statistic,
        n_resamples=draws,
        paired=True,
        vectorized=True,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
