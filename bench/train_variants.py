"""Bench: DFlash vs DFlash 2 at an equal budget on SmolLM2-135M (CPU).

Regenerates (or reuses) one data set, trains both variants with the same recipe and steps, and prints
held-out tau (greedy, block 8) for each, the DFlash 2 / DFlash ratio, the oracle tau (gold token anywhere in
the top-K), an untrained drafter's tau, and training throughput. Numbers, not assertions.

    python bench/train_variants.py --work /tmp/bench --steps 300 [--data out/smollm2-135m/.work/data]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


from schemas.sampling import SamplingParams
from trainer.data.prompts import load_prompts, split_prompts
from trainer.data.regenerate import regenerate
from trainer.data.store import DataStore
from trainer.drafter.checkpoint import load_drafter
from trainer.drafter.config import DrafterConfig, default_target_layer_ids
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.targets.bundled import resolve_target_path
from trainer.targets.chat import choose_mask_token_id, render_prompt
from trainer.training.config import TrainConfig
from trainer.training.init import initial_drafter
from trainer.training.loop import Trainer
from trainer.validation import VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS
from trainer.validation.acceptance import CategoryStats


def held_out_tau(target, drafter, prompts, params) -> CategoryStats:
    stats = CategoryStats(drafter.config.block_size)
    decoder = SpeculativeDecoder(target, drafter.eval(), record_candidates=True)
    for prompt in prompts:
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template)
        result = decoder.generate(ids, params)
        stats.add(prompt.category, result.tokens, result.cycles)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--work", type=Path, default=Path("/tmp/draftsmith-bench"))
    parser.add_argument("--data", type=Path, default=None,
                        help="Reuse a data set from `draftsmith generate` / `draftsmith run` (OUT/.work/data).")
    parser.add_argument("--train-prompts", type=int, default=None, help="Default: the whole training split.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--eval-prompts", type=int, default=VALIDATION_PROMPTS)
    parser.add_argument("--eval-max-new-tokens", type=int, default=VALIDATION_MAX_NEW_TOKENS)
    parser.add_argument("--variants", default="dflash2,dflash")
    parser.add_argument("--init", default=TrainConfig.init, choices=["target", "random"])
    args = parser.parse_args()

    target = load_target(resolve_target_path(args.target))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    train_prompts, holdout = split_prompts(load_prompts(), 0.1, limit=args.train_prompts)
    taps = default_target_layer_ids(target.num_layers, args.layers)
    data_dir = args.data or args.work / "data"
    started = time.perf_counter()
    store = (DataStore.open(data_dir) if (data_dir / "COMPLETE").is_file()
             else regenerate(target, train_prompts, params, data_dir, tap_layer_ids=taps, batch_size=32))
    print(f"data: {store.summary()} ({time.perf_counter() - started:.0f} s)", flush=True)

    mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)
    eval_params = SamplingParams(max_new_tokens=args.eval_max_new_tokens)
    eval_prompts = holdout[:args.eval_prompts]
    results: dict[str, dict] = {}
    for variant in args.variants.split(","):
        config = DrafterConfig.for_target(target, variant=variant, num_layers=args.layers, block_size=args.block_size,
                                          mask_token_id=mask_token_id, target_layer_ids=taps)
        if variant == "dflash2":  # the untrained baseline: same init, no training
            untrained = initial_drafter(config, target, store.examples(), args.init, TrainConfig.seed)
            stats = held_out_tau(target, untrained, eval_prompts[:6], eval_params)
            results["untrained"] = {"tau": round(stats.overall.tau, 3)}
            print(f"untrained dflash2: tau {stats.overall.tau:.3f}", flush=True)
        cfg = TrainConfig(steps=args.steps, init=args.init, checkpoint_every=10**6)
        started = time.perf_counter()
        records: list[dict] = []
        Trainer(target, store, args.work / variant, config, cfg, [records.append]).run()
        train_seconds = time.perf_counter() - started
        drafter = load_drafter(args.work / variant / "drafter")
        stats = held_out_tau(target, drafter, eval_prompts, eval_params)
        results[variant] = {
            "tau": round(stats.overall.tau, 3), "oracle_tau": round(stats.overall.oracle_tau or 0, 3),
            "per_position": [round(a or 0, 3) for a in stats.overall.per_position],
            "by_category": stats.acceptance_by_category(), "train_minutes": round(train_seconds / 60, 2),
            "train_tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in records), 1),
            "final_loss": records[-1]["loss"], "train_tau_estimate": records[-1]["train_tau_estimate"],
        }
        print(f"{variant}: {json.dumps(results[variant])}", flush=True)
    if "dflash" in results and "dflash2" in results:
        results["dflash2_over_dflash"] = round(results["dflash2"]["tau"] / results["dflash"]["tau"], 3)
    print(json.dumps(results, indent=2))
    (args.work / "bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
