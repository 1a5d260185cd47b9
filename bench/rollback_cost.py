"""Bench: what the exact rollback of a recurrent state costs when decoding, batch 1, on this machine.

A target with linear-attention layers (Qwen3.5, Qwen3-Next) is put back after a partly rejected verify by
restoring the states saved before it and replaying the accepted tokens (trainer/targets/loading.py `rewind`).
This prints the decode time with that rollback and, for comparison only, with a plain crop (which leaves the
recurrent state wrong: its tokens are not the target's), the cycles, tau, and the share of cycles with a
rejection (each of which replays).
Without --drafter an untrained drafter is used: nearly every draft is rejected, the worst case for rollback.

    python -m bench.rollback_cost --target DIR [--drafter DIR] [--prompts 3] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def untrained_drafter(target, block_size: int):
    import torch

    from trainer.drafter import Drafter, DrafterConfig
    from trainer.targets.chat import choose_mask_token_id

    mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)
    config = DrafterConfig.for_target(target, num_layers=1, block_size=block_size, mask_token_id=mask_token_id,
                                      selector_top_k=min(16, target.vocab_size // 2), selector_rank=16)
    torch.manual_seed(0)
    return Drafter(config).to(target.dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="A target folder with linear-attention layers.")
    parser.add_argument("--drafter", type=Path, help="A trained drafter folder (default: an untrained one).")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from schemas.sampling import SamplingParams
    from trainer.drafter.checkpoint import load_drafter
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets import load_target
    from trainer.targets.families import Rollback

    target = load_target(args.target)
    if target.rollback is not Rollback.REPLAY:
        raise SystemExit(f"{args.target}: every layer of this target can be cropped; nothing to measure")
    drafter = load_drafter(args.drafter).to(target.dtype) if args.drafter else untrained_drafter(target, args.block_size)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    prompts = [list(range(5 + i, 40 + i)) for i in range(args.prompts)]
    for mode in (Rollback.REPLAY, Rollback.CROP):
        target.rollback = mode
        decoder = SpeculativeDecoder(target, drafter)
        decoder.generate(prompts[0], params, stop_token_ids=[])  # warm-up
        started = time.perf_counter()
        results = [decoder.generate(prompt, params, stop_token_ids=[]) for prompt in prompts]
        seconds = (time.perf_counter() - started) / len(prompts)
        cycles = [cycle for result in results for cycle in result.cycles]
        replayed = sum(cycle.accepted < cycle.offered for cycle in cycles) / max(len(cycles), 1)
        label = "restore + replay (exact)" if mode is Rollback.REPLAY else "crop only (inexact, cost only)"
        print(f"{label:32s} {seconds * 1000:8.0f} ms/decode  {len(cycles) / len(prompts):5.1f} cycles  "
              f"tau {sum(c.emitted for c in cycles) / max(len(cycles), 1):.2f}  a rejection in {replayed:.0%} of cycles")
    target.rollback = Rollback.REPLAY


if __name__ == "__main__":
    main()
