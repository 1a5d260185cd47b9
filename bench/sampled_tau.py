"""Bench: tau under speculative *sampling* (temperature 1 by default), next to the greedy tau that replay gives.

Greedy acceptance can be replayed against the target's known output (trainer/validation/replay.py); sampled
acceptance cannot (each accepted token changes what the target sees next), so this runs the real decoder:
rejection sampling against the target's distribution, one seeded generator per prompt, so two drafters are
compared on the same prompts with the same seeds (paired bootstrap over prompts).

    python -m bench.sampled_tau --drafter RUN_A/drafter --drafter RUN_B/drafter --prompts 24 [--temperature 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def sampled_tau(target, drafter, prompts, temperature: float = 1.0, max_new_tokens: int = 96, seed: int = 0,
                block_size: int | None = None) -> dict:
    """tau (tokens per verify pass, bonus counted) of speculative sampling on `prompts`, with per-prompt
    (emitted, cycles) for a bootstrap."""
    import torch

    from schemas.sampling import SamplingParams
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets.chat import render_prompt

    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    decoder = SpeculativeDecoder(target, drafter.eval(), block_size)
    per_prompt = []
    for index, prompt in enumerate(prompts):
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template)
        result = decoder.generate(ids, params, generator=torch.Generator().manual_seed(seed + index))
        per_prompt.append((sum(c.emitted for c in result.cycles), len(result.cycles)))
    tau = sum(e for e, _ in per_prompt) / max(1, sum(c for _, c in per_prompt))
    return {"tau": round(tau, 4), "temperature": temperature, "prompts": len(prompts), "per_prompt": per_prompt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", type=Path, action="append", required=True)
    parser.add_argument("--prompts", type=int, default=24, help="Held-out prompts of the built-in set.")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from schemas import recipe
    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.drafter.checkpoint import load_drafter
    from trainer.device import load_target_on
    from trainer.targets.bundled import resolve_target_path
    from trainer.validation.replay import bootstrap_interval

    target = load_target_on(resolve_target_path(args.target), args.device)
    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    first = None
    for path in args.drafter:
        started = time.perf_counter()
        result = sampled_tau(target, load_drafter(path), holdout[:args.prompts], args.temperature,
                             args.max_new_tokens)
        low, high = bootstrap_interval(result["per_prompt"])
        line = f"{path}: tau at T={args.temperature} {result['tau']:.3f} [{low:.3f}, {high:.3f}]"
        if first is not None:
            d_low, d_high = bootstrap_interval(result["per_prompt"], first["per_prompt"])
            line += f", vs the first {result['tau'] - first['tau']:+.3f} [{d_low:+.3f}, {d_high:+.3f}]"
        print(line + f" ({time.perf_counter() - started:.0f} s)", flush=True)
        first = first or result


if __name__ == "__main__":
    main()
