"""Bench: the generate stage's two response backends on this machine (trainer/data/regenerate.py).

- builtin: the target's own batched loop, hidden states and teacher signal captured in the same passes;
- vllm: vLLM's CPU build writes the responses (trainer/data/vllm_backend.py), then one teacher-forced pass of
  the target per batch captures the same data (trainer/data/capture.py).

Greedy, float32 on both sides, the same tapped layers and teacher top-k as a job. Prints tokens/s of each part,
vLLM's one-off start-up, and greedy agreement: prompts answered identically, the share of tokens identical up
to each prompt's first divergence, and at every divergence the built-in target's margin between its two most
likely tokens (a near tie that float rounding in a different kernel can flip), with the load average.

    python -m bench.generate_backends [--prompts 32] [--max-new-tokens 64] [--batch-size 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def batched(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32, help="Built-in prompts drawn (trainer.data.prompts).")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="Prompts per batch (built-in loop and capture).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="Default: torch's (both engines get the same).")
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from schemas import recipe
    from schemas.sampling import SamplingParams
    from trainer.data.capture import capture_batch
    from trainer.data.prompts import draw_prompts
    from trainer.data.regenerate import TEACHER_TOP_K, generate_batch, tokenize_prompts
    from trainer.data.vllm_backend import VllmResponses
    from trainer.device import load_target_on
    from trainer.drafter.config import default_target_layer_ids
    from trainer.targets.bundled import resolve_target_path

    load_before = os.getloadavg()
    target = load_target_on(resolve_target_path(args.target), args.device)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=args.seed)
    taps = default_target_layer_ids(target.num_layers, recipe.NUM_LAYERS)
    prompt_ids = sorted(tokenize_prompts(target, draw_prompts("builtin", args.prompts, args.seed), params), key=len)
    batches = batched(prompt_ids, args.batch_size)
    figures: dict = {"target": args.target, "prompts": len(prompt_ids), "max_new_tokens": args.max_new_tokens,
                     "batch_size": args.batch_size, "threads": torch.get_num_threads(), "tap_layer_ids": taps,
                     "teacher_top_k": TEACHER_TOP_K, "load_before": [round(x, 2) for x in load_before]}

    started = time.perf_counter()
    fused = [out for batch in batches for out in generate_batch(target, batch, params, taps, None, TEACHER_TOP_K)]
    builtin_s = time.perf_counter() - started
    builtin_tokens = sum(len(r) for r, *_ in fused)

    started = time.perf_counter()
    with VllmResponses(target) as backend:
        startup_s = time.perf_counter() - started
        responses = backend.respond(prompt_ids, params, params.seed * 100_003)  # one shard, as regenerate asks
        vllm_s, vllm_tokens, version = backend.seconds, backend.tokens, backend.vllm_version

    started = time.perf_counter()
    captured = [out for batch, answers in zip(batches, batched(responses, args.batch_size))
                for out in capture_batch(target, batch, answers, taps, TEACHER_TOP_K)]
    capture_s = time.perf_counter() - started

    # Greedy agreement, against the built-in loop; at a divergence, how close the built-in target's top two were.
    divergences, prefix = [], 0
    for i, ((ours, *_, teacher), (theirs, _)) in enumerate(zip(fused, responses)):
        same = common_prefix(ours, theirs)
        prefix += same
        if ours != theirs and same < len(ours) and same < len(theirs):
            logits = teacher.logits[same]
            second = teacher.ids[same].tolist().index(theirs[same]) if theirs[same] in teacher.ids[same] else None
            divergences.append({"prompt": i, "position": same, "top2_margin": round(float(logits[0] - logits[1]), 5),
                                "vllm_token_rank": None if second is None else second + 1})
        elif ours != theirs:
            divergences.append({"prompt": i, "position": same, "note": "one response is a prefix of the other"})
    identical = sum(a == b for (a, *_), (b, _) in zip(fused, responses))
    # Where the tokens are the same, the teacher-forced capture should equal the fused one up to float32 summation
    # order (a full-sequence forward against a cached step-by-step one), which bfloat16 storage mostly hides.
    pairs = [(f[1].float(), c[1].float()) for f, c in zip(fused, captured) if f[0] == c[0]]
    drift = {"max_abs": max(float((a - b).abs().max()) for a, b in pairs),
             "max_rel_where_abs_ge_1": max(float(((a - b).abs() / a.abs())[a.abs() >= 1].max()) for a, b in pairs),
             "share_not_bit_identical": sum(int((a != b).sum()) for a, b in pairs) / sum(a.numel() for a, _ in pairs),
             "max_abs_value": max(float(a.abs().max()) for a, _ in pairs)} if pairs else None

    figures.update({
        "vllm_version": version, "load_after": [round(x, 2) for x in os.getloadavg()],
        "builtin": {"seconds": round(builtin_s, 2), "tokens": builtin_tokens,
                    "tokens_per_s": round(builtin_tokens / builtin_s, 2)},
        "vllm_startup_s": round(startup_s, 1),
        "vllm_generate": {"seconds": round(vllm_s, 2), "tokens": vllm_tokens,
                          "tokens_per_s": round(vllm_tokens / vllm_s, 2)},
        "capture": {"seconds": round(capture_s, 2), "tokens": vllm_tokens,
                    "tokens_per_s": round(vllm_tokens / capture_s, 2),
                    "positions_read": sum(len(p) + len(r) - 1 for p, (r, _) in zip(prompt_ids, responses))},
        "vllm_total": {"seconds": round(vllm_s + capture_s, 2),
                       "tokens_per_s": round(vllm_tokens / (vllm_s + capture_s), 2)},
        "greedy_agreement": {"identical_prompts": identical, "of": len(prompt_ids),
                             "identical_token_share": round(prefix / max(1, builtin_tokens), 4),
                             "divergences": divergences},
        "taps_capture_vs_fused": drift,
    })
    rows = [("builtin loop (generate + capture fused)", figures["builtin"]),
            ("vllm generate alone", figures["vllm_generate"]),
            ("capture pass over vllm's responses", figures["capture"]),
            ("vllm total (generate + capture)", figures["vllm_total"])]
    print(f"{args.target}: {len(prompt_ids)} prompts x <= {args.max_new_tokens} new tokens, batch {args.batch_size}, "
          f"{figures['threads']} threads, vLLM {version}; load {figures['load_before']} -> {figures['load_after']}")
    print(f"{'part':42} {'seconds':>9} {'tokens':>7} {'tokens/s':>9}")
    for name, part in rows:
        print(f"{name:42} {part['seconds']:9.2f} {part.get('tokens', vllm_tokens):7d} {part['tokens_per_s']:9.2f}")
    print(f"vLLM start-up (once per stage): {startup_s:.1f} s; capture read "
          f"{figures['capture']['positions_read']} positions")
    agreement = figures["greedy_agreement"]
    print(f"greedy agreement: {identical}/{len(prompt_ids)} prompts identical, "
          f"{agreement['identical_token_share']:.1%} of tokens identical up to the first divergence")
    for d in divergences:
        print(f"  prompt {d['prompt']}: first differs at token {d['position']}; "
              + (f"built-in top-2 logit margin {d['top2_margin']}, vLLM's token is its "
                 + (f"#{d['vllm_token_rank']}" if d["vllm_token_rank"] else f"not in its top {TEACHER_TOP_K}")
                 if "top2_margin" in d else d["note"]))
    if drift:
        print(f"stored taps, capture vs fused (identical responses): max |difference| {drift['max_abs']:.4g} "
              f"(values up to {drift['max_abs_value']:.4g}), max relative {drift['max_rel_where_abs_ge_1']:.2e} "
              f"where |value| >= 1, {drift['share_not_bit_identical']:.3%} of values not bit-identical")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
