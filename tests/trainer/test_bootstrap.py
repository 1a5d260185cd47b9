"""trainer/bootstrap.py, the one resampler, against a plain percentile bootstrap (bench/bootstrap_shift.py's loops: the
ones the validation report and the bench used before scipy drew their resamples) and against the normal approximation a
large sample gives. Both resamplers are seeded, so each comparison is deterministic; the tolerance is a share of
the interval's width, the Monte-Carlo noise of 4,000 draws being a few per cent of it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.bootstrap_shift import better_on_a_third, held_out, plain_interval, plain_pooled_interval, plain_tau
from trainer.bootstrap import (
    bootstrap_interval,
    paired_ratio_interval,
    ratio_of_sums,
    seed_pooled_ratio_interval,
)

TOLERANCE = 0.1
"""Largest gap between an endpoint here and the plain loop's, as a share of the interval's width."""


def assert_close(got: tuple[float, float], expected: tuple[float, float]) -> None:
    width = expected[1] - expected[0]
    assert width > 0
    assert abs(got[0] - expected[0]) <= TOLERANCE * width and abs(got[1] - expected[1]) <= TOLERANCE * width, (
        got,
        expected,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tau_and_the_paired_figures_match_the_plain_loop(seed):
    base = held_out(seed)
    new = better_on_a_third(base)
    assert_close(bootstrap_interval(base), plain_interval(lambda p: plain_tau(base, p), len(base)))
    assert_close(
        bootstrap_interval(new, base), plain_interval(lambda p: plain_tau(new, p) - plain_tau(base, p), len(base))
    )
    assert_close(
        paired_ratio_interval(new, base), plain_interval(lambda p: plain_tau(new, p) / plain_tau(base, p), len(base))
    )


def test_pairing_is_what_narrows_the_difference():
    """Resampled together, a prompt's difficulty cancels: the paired interval of a uniform gain is far narrower
    than tau's own interval, and it excludes 0."""
    base = held_out(4)
    new = [(e + 2, c) for e, c in base]
    low, high = bootstrap_interval(new, base)
    tau_low, tau_high = bootstrap_interval(base)
    assert 0 < low < high < 2 * (ratio_of_sums(new) - ratio_of_sums(base))
    assert high - low < 0.5 * (tau_high - tau_low)


def test_a_large_sample_gives_the_normal_interval_of_the_mean():
    """One cycle per prompt makes tau the mean of the emitted counts: for 3,000 prompts the percentile interval is
    mean +- 1.96 sd / sqrt(n) to within a few per cent of its half-width."""
    rng = np.random.default_rng(5)
    values = rng.exponential(3.0, 3000)
    low, high = bootstrap_interval([(v, 1) for v in values])
    half = 1.96 * values.std(ddof=1) / math.sqrt(len(values))
    assert abs(low - (values.mean() - half)) < 0.06 * half
    assert abs(high - (values.mean() + half)) < 0.06 * half


def test_the_seed_pooled_ratio_matches_the_plain_two_level_loop():
    runs = [held_out(10 + s, gain=0.15) for s in range(3)]
    references = [held_out(20 + s) for s in range(3)]
    assert_close(seed_pooled_ratio_interval(runs, references), plain_pooled_interval(runs, references))


def test_intervals_are_seeded_and_cover_their_estimate():
    per_prompt = held_out(6)
    assert bootstrap_interval(per_prompt, seed=3) == bootstrap_interval(per_prompt, seed=3)
    assert bootstrap_interval(per_prompt, seed=3) != bootstrap_interval(per_prompt, seed=4)
    low, high = bootstrap_interval(per_prompt)
    assert low < ratio_of_sums(per_prompt) < high


def test_one_prompt_is_its_own_interval_and_none_or_unpaired_prompts_are_refused():
    assert bootstrap_interval([(7, 2)]) == (3.5, 3.5)
    with pytest.raises(ValueError, match="no prompts"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="same prompts"):
        paired_ratio_interval([(3, 2), (4, 2)], [(3, 2)])
    with pytest.raises(ValueError, match="same prompts"):
        seed_pooled_ratio_interval([[(3, 2), (4, 2)]], [[(3, 2)]])
