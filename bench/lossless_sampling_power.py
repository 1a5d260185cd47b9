"""Bench: how many draws tests/trainer/test_lossless_sampling.py needs to catch a wrong residual.

On the test's enumerable target (16 tokens, block 3, 4 new tokens, its random DFlash 2 drafter), draw the
speculative samples of a decoder that resamples from p instead of norm(max(p - q, 0)) after a rejection, for
several seeds, and print the test's p-value (`fit_p_value`: the joint law and each drafted position's marginal,
Bonferroni) on the first N draws of each seed. The test calls a decoder wrong below 1e-3; the share of seeds below
it at N draws is the test's power there, which sizes its DRAWS.

    python -m bench.lossless_sampling_power [--seeds 5] [--draws 200,500,1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

THRESHOLD = 1e-3
"""The p-value below which the test calls the decoder wrong (test_wrong_residual_is_caught)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--draws", default="200,500,1000", help="Draw counts to read the p-value at.")
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.draws.split(","))

    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path[:0] = [str(tests), str(tests / "trainer")]
    import torch
    from drafters import random_drafter
    from test_lossless_sampling import CASES, exact_sequence_probs, fit_p_value, speculative_samples
    from tiny_targets import make_tiny_target

    import trainer.sampling
    from trainer.targets import load_target

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:  # the test's peaked_target fixture
        target = load_target(make_tiny_target(Path(folder) / "peaked", "qwen3", vocab_size=16, hidden_size=32,
                                              num_layers=4, init_std=0.3, seed=3))
    params = CASES[0][1]
    exact = exact_sequence_probs(target, params)
    drafter = random_drafter(target, "dflash2", block_size=3, selector_top_k=8, selector_rank=8, scale=0.5)
    trainer.sampling.residual_distribution = lambda p, q: p  # the planted bug
    caught = dict.fromkeys(counts, 0)
    print("seed  " + "  ".join(f"p at {n:>5}" for n in counts))
    for seed in range(args.seeds):
        samples = speculative_samples(target, drafter, params, counts[-1], seed)
        values = [fit_p_value(samples[:n], exact) for n in counts]
        for n, value in zip(counts, values, strict=True):
            caught[n] += value < THRESHOLD
        print(f"{seed:>4}  " + "  ".join(f"{value:>10.1e}" for value in values), flush=True)
    print("caught " + ", ".join(f"{caught[n]}/{args.seeds} at {n}" for n in counts) + f" (p < {THRESHOLD:g})")


if __name__ == "__main__":
    main()
