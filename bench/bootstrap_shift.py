"""How far the intervals moved when trainer/bootstrap.py (scipy.stats.bootstrap) replaced the `random.Random`
percentile loops: the figure docs/RESULTS.md states ("Intervals").

On synthetic data sets shaped like the recipe study's held-out set (`held_out`: 66 prompts, 40-96 tokens each, tau
spread around 2.2), each statistic's 95 % interval is drawn twice, by trainer/bootstrap.py and by the loop it
replaced (written out here as the validation report and the bench wrote it: `plain_interval`, `plain_pooled_interval`),
both at seed 0. Printed per statistic: the largest endpoint shift over the data sets, that shift as a share of the
old interval's width there, and for scale how far the old loop itself moves from its seed 0 to its seed 1. The
statistics: tau; the paired difference and the paired ratio of a drafter slightly better on a third of the prompts
against its baseline; the seed-pooled ratio of 3 training seeds a side (the recipe study's two-level bootstrap, gain
0.15); and a speedup on 6 timed prompts (validation's, whose old loop drew 2,000 resamples, not 4,000).

    python -m bench.bootstrap_shift [--sets 20] [--prompts 66] [--draws 4000]

This module is the one place outside trainer/bootstrap.py that draws resamples of its own (tests/test_layout.py
`RESAMPLE_REFERENCES`): the old loops are the reference it measures against. tests/trainer/test_bootstrap.py
imports the same data sets and loops.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence

import numpy as np

from trainer.bootstrap import DRAWS, bootstrap_interval, paired_ratio_interval, seed_pooled_ratio_interval

Pairs = list[tuple[int, int]]
TIMED_PROMPTS = 6
"""Validation times one prompt a category side by side with the target alone (six categories)."""


def held_out(seed: int, count: int = 66, gain: float = 0.0) -> Pairs:
    """(tokens emitted, cycles) for `count` prompts shaped like the recipe study's held-out set: 40-96 tokens a
    prompt, tau spread around 2.2 from prompt to prompt (easy and hard prompts)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(40, 97, count)
    tau = np.clip(rng.normal(2.2, 0.6, count), 1.0, 6.0) + gain
    return [(int(t), max(1, round(t / a))) for t, a in zip(tokens, tau, strict=True)]


def better_on_a_third(base: Pairs) -> Pairs:
    """The same prompts, one cycle fewer on every third: a drafter slightly better than `base`."""
    return [(e, max(1, c - (i % 3 == 0))) for i, (e, c) in enumerate(base)]


def timed(seed: int, count: int = TIMED_PROMPTS) -> list[tuple[float, float]]:
    """(seconds alone, seconds speculative) per timed prompt: a target step of 25 ms per token alone, a verify
    cycle 30 % dearer (the drafter's own passes), each prompt's timings jittered by 5 %."""
    rng = np.random.default_rng(seed)
    jitter = rng.normal(1.0, 0.05, (count, 2))
    return [(0.025 * e * a, 0.025 * 1.3 * c * b) for (e, c), (a, b) in zip(held_out(seed, count), jitter, strict=True)]


def plain_tau(per_prompt: Sequence[Sequence[float]], picks: Sequence[int]) -> float:
    return sum(per_prompt[i][0] for i in picks) / max(1, sum(per_prompt[i][1] for i in picks))


def plain_interval(statistic: Callable[[list[int]], float], count: int, draws: int = DRAWS, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float]:
    """The old percentile loop: `draws` resamples of `count` prompt indices from `random.Random(seed)`."""
    rng = random.Random(seed)
    values = sorted(statistic([rng.randrange(count) for _ in range(count)]) for _ in range(draws))
    return values[int((1 - level) / 2 * draws)], values[min(draws - 1, int((1 + level) / 2 * draws))]


def plain_pooled_interval(runs: Sequence[Pairs], references: Sequence[Pairs], draws: int = DRAWS, level: float = 0.95,
                          seed: int = 0) -> tuple[float, float]:
    """The recipe study's old two-level loop: each draw resamples the prompts, then each side's training seeds."""
    count = len(runs[0])

    def pooled(side: Sequence[Pairs], seeds: list[int], prompts: list[int]) -> float:
        return sum(side[s][p][0] for s in seeds for p in prompts) / sum(side[s][p][1] for s in seeds for p in prompts)

    rng = random.Random(seed)
    ratios = sorted(
        pooled(runs, [rng.randrange(len(runs)) for _ in runs], prompts)
        / pooled(references, [rng.randrange(len(references)) for _ in references], prompts)
        for prompts in ([rng.randrange(count) for _ in range(count)] for _ in range(draws))
    )
    return ratios[int((1 - level) / 2 * draws)], ratios[min(draws - 1, int((1 + level) / 2 * draws))]


Interval = Callable[[object, int, int], tuple[float, float]]
"""(data set, draws, seed) -> (low, high)."""


def _tau_new(data, draws, seed):
    return bootstrap_interval(data, draws=draws, seed=seed)


def _tau_old(data, draws, seed):
    return plain_interval(lambda p: plain_tau(data, p), len(data), draws, seed=seed)


def _difference_new(data, draws, seed):
    return bootstrap_interval(data[1], data[0], draws=draws, seed=seed)


def _difference_old(data, draws, seed):
    base, new = data
    return plain_interval(lambda p: plain_tau(new, p) - plain_tau(base, p), len(base), draws, seed=seed)


def _ratio_new(data, draws, seed):
    return paired_ratio_interval(data[1], data[0], draws=draws, seed=seed)


def _ratio_old(data, draws, seed):
    base, new = data
    return plain_interval(lambda p: plain_tau(new, p) / plain_tau(base, p), len(base), draws, seed=seed)


def _pooled_new(data, draws, seed):
    return seed_pooled_ratio_interval(*data, draws=draws, seed=seed)


def _pooled_old(data, draws, seed):
    return plain_pooled_interval(*data, draws=draws, seed=seed)


def _speedup_new(data, draws, seed):
    return bootstrap_interval(data, draws=draws, seed=seed)


def _speedup_old(data, draws, seed):  # validation's old loop drew half the resamples
    return plain_interval(lambda p: plain_tau(data, p), len(data), max(1, draws // 2), seed=seed)


def statistics(prompts: int) -> dict[str, tuple[Callable[[int], object], Interval, Interval]]:
    """Each statistic's data set for a set index, its interval by trainer/bootstrap.py and by the old loop."""

    def pair(s: int):
        base = held_out(s, prompts)
        return base, better_on_a_third(base)

    def seeds(s: int):
        return ([held_out(1000 + 10 * s + k, prompts, gain=0.15) for k in range(3)],
                [held_out(1000 + 10 * s + 5 + k, prompts) for k in range(3)])

    return {
        "tau": (lambda s: held_out(s, prompts), _tau_new, _tau_old),
        "paired difference": (pair, _difference_new, _difference_old),
        "paired ratio": (pair, _ratio_new, _ratio_old),
        "seed-pooled ratio, 3 seeds a side": (seeds, _pooled_new, _pooled_old),
        f"speedup, {TIMED_PROMPTS} prompts": (timed, _speedup_new, _speedup_old),
    }


def shifts(sets: int = 20, prompts: int = 66, draws: int = DRAWS) -> dict[str, dict[str, float]]:
    """Per statistic, over data sets 0..sets-1: the largest endpoint shift from the old loop to trainer/bootstrap.py
    (`shift`), that shift over the old interval's width on its data set (`share`), and the largest endpoint move of
    the old loop from seed 0 to seed 1 (`old_seed_move`)."""
    found = {}
    for name, (data_of, new, old) in statistics(prompts).items():
        shift = share = move = 0.0
        for s in range(sets):
            data = data_of(s)
            before, after, reseeded = old(data, draws, 0), new(data, draws, 0), old(data, draws, 1)
            gap = max(abs(a - b) for a, b in zip(after, before, strict=True))
            width = before[1] - before[0]
            if gap > shift:
                shift, share = gap, gap / width if width > 0 else float("inf")
            move = max(move, *(abs(a - b) for a, b in zip(reseeded, before, strict=True)))
        found[name] = {"shift": shift, "share": share, "old_seed_move": move}
    return found


def render(found: dict[str, dict[str, float]]) -> str:
    lines = [f"{'statistic':36} {'max shift':>10} {'of width':>9} {'old loop seed 0 -> 1':>21}"]
    for name, row in found.items():
        lines.append(f"{name:36} {row['shift']:10.4f} {row['share']:8.1%} {row['old_seed_move']:21.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=20, help="data sets per statistic")
    parser.add_argument("--prompts", type=int, default=66, help="prompts per held-out data set")
    parser.add_argument("--draws", type=int, default=DRAWS, help="resamples (the old speedup loop draws half)")
    args = parser.parse_args(argv)
    print(f"{args.sets} data sets of {args.prompts} prompts ({TIMED_PROMPTS} for the speedup), {args.draws} draws, "
          "old loop and trainer/bootstrap.py both at seed 0")
    print(render(shifts(args.sets, args.prompts, args.draws)))


if __name__ == "__main__":
    main()
