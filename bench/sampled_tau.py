"""Bench: tau under speculative *sampling* (temperature 1 by default), next to the greedy tau that replay gives.

The measurement is validation's own (trainer/validation/sampled_acceptance.py: the real decoder, rejection
sampling against the target, one seeded generator per prompt), so two drafters are compared on the same prompts with
the same seeds (paired bootstrap over prompts), and a figure here is the one report.json's `tau_sampled` gives.

    python -m bench.sampled_tau --drafter RUN_A/drafter --drafter RUN_B/drafter --prompts 24 [--temperature 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def sampled_tau(target, drafter, prompts, temperature: float = 1.0, max_new_tokens: int = 96, seed: int = 0,
                block_size: int | None = None, top_p: float = 1.0, top_k: int = 0) -> dict:
    """tau (tokens per verify pass, bonus counted) of speculative sampling on `prompts`, with per-prompt
    (emitted, cycles) for a bootstrap: validation's measurement, as a row of this bench."""
    from schemas.sampling import SamplingParams
    from trainer.validation.sampled_acceptance import sampled_acceptance

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                            seed=seed)
    result = sampled_acceptance(target, drafter, prompts, params, block_size=block_size)
    return {"tau": round(result.tau, 4), "temperature": temperature, "prompts": len(prompts),
            "per_prompt": result.per_prompt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", type=Path, action="append", required=True)
    parser.add_argument("--prompts", type=int, default=24, help="Held-out prompts of the built-in set.")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from schemas import recipe
    from trainer.bootstrap import bootstrap_interval
    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.device import load_target_on
    from trainer.drafter.checkpoint import load_drafter
    from trainer.targets.bundled import resolve_target_path

    target = load_target_on(resolve_target_path(args.target), args.device)
    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    first = None
    for path in args.drafter:
        started = time.perf_counter()
        result = sampled_tau(target, load_drafter(path), holdout[:args.prompts], args.temperature,
                             args.max_new_tokens, top_p=args.top_p, top_k=args.top_k)
        low, high = bootstrap_interval(result["per_prompt"])
        line = f"{path}: tau at T={args.temperature} {result['tau']:.3f} [{low:.3f}, {high:.3f}]"
        if first is not None:
            d_low, d_high = bootstrap_interval(result["per_prompt"], first["per_prompt"])
            line += f", vs the first {result['tau'] - first['tau']:+.3f} [{d_low:+.3f}, {d_high:+.3f}]"
        print(line + f" ({time.perf_counter() - started:.0f} s)", flush=True)
        first = first or result


if __name__ == "__main__":
    main()
