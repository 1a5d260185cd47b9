"""Bench: does the per-job sampling check catch a wrong residual with a real trained drafter?

Runs validation's sampling test (trainer/validation/sampling_test.py) with its defaults on SmolLM2 and a
trained drafter, once with the correct speculative decoder and once with a decoder that resamples from p
instead of norm(max(p - q, 0)) after a rejection, for several seeds, and prints the p-values. The unit
test (tests/trainer/test_sampling_check_power.py) shows the same with a stand-in drafter; this shows how
much power is left with the drafter a job actually produces.

    python -m bench.sampling_power --drafter RUN/drafter [--seeds 3] [--block-size B]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=None, help="Default: the drafter's.")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import trainer.sampling
    from schemas import recipe
    from schemas.sampling import SamplingParams
    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.device import load_target_on
    from trainer.drafter.checkpoint import load_drafter
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets.bundled import resolve_target_path
    from trainer.targets.chat import render_prompt
    from trainer.validation.sampling_test import sampling_lossless_test

    target = load_target_on(resolve_target_path(args.target), args.device)
    drafter = load_drafter(args.drafter)
    decoder = SpeculativeDecoder(target, drafter, block_size=args.block_size)
    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    prompts = [render_prompt(target.tokenizer, list(p.messages)) for p in holdout[:recipe.SAMPLING_PROMPTS]]
    params = SamplingParams(temperature=1.0)
    correct_residual = trainer.sampling.residual_distribution
    for name, residual in (("correct residual", correct_residual), ("residual = p", lambda p, q: p)):
        trainer.sampling.residual_distribution = residual
        for seed in range(args.seeds):
            result = sampling_lossless_test(decoder, prompts, params, draws=recipe.SAMPLING_DRAWS, seed=seed)
            print(json.dumps({"decoder": name, "seed": seed, "p_value": result["p_value"],
                              "statistic": result["statistic"], "dof": result["degrees_of_freedom"],
                              "groups_by_position": result["groups_by_position"]}), flush=True)
    trainer.sampling.residual_distribution = correct_residual


if __name__ == "__main__":
    main()
