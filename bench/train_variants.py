"""Bench: DFlash vs DFlash 2 at an equal budget on SmolLM2-135M (CPU).

Both variants train on one regenerated data set with the same recipe and steps, and are validated on the
same held-out prompts, through `trainer.pipeline.run_stage`: the stage wiring `draftsmith run` and the
service use, so the bench measures exactly what a job would produce. Prints held-out tau (greedy), the
DFlash 2 / DFlash ratio, oracle tau, per-position acceptance, tau by category and training throughput.
Numbers, not assertions.

    python -m bench.train_variants --work /tmp/bench --steps 300 [--data out/smollm2-135m/.work/data]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path

from schemas import recipe
from schemas.sampling import SamplingParams
from schemas.stages import Stage
from schemas.validation_report import ValidationReport
from trainer.pipeline import Layout, RunConfig, open_job, run_stage
from trainer.training.config import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--work", type=Path, default=Path("/tmp/draftsmith-bench"))
    parser.add_argument("--data", type=Path, default=None,
                        help="Reuse a data set from `draftsmith generate` / `draftsmith run` (OUT/.work/data).")
    parser.add_argument("--num-prompts", type=int, default=None, help="Prompts drawn (default: all).")
    parser.add_argument("--max-new-tokens", type=int, default=recipe.MAX_NEW_TOKENS)
    parser.add_argument("--steps", type=int, default=recipe.TRAIN_STEPS)
    parser.add_argument("--layers", type=int, default=recipe.NUM_LAYERS)
    parser.add_argument("--block-size", type=int, default=recipe.BLOCK_SIZE)
    parser.add_argument("--eval-prompts", type=int, default=recipe.VALIDATION_PROMPTS)
    parser.add_argument("--eval-max-new-tokens", type=int, default=recipe.VALIDATION_MAX_NEW_TOKENS)
    parser.add_argument("--sampling-draws", type=int, default=100)
    parser.add_argument("--variants", default="dflash2,dflash")
    args = parser.parse_args()

    base = RunConfig(target=args.target, sampling=SamplingParams(max_new_tokens=args.max_new_tokens),
                     num_prompts=args.num_prompts, num_layers=args.layers, block_size=args.block_size,
                     train=TrainConfig(steps=args.steps, max_minutes=None, checkpoint_every=10**6),
                     validation_prompts=args.eval_prompts, validation_max_new_tokens=args.eval_max_new_tokens,
                     sampling_draws=args.sampling_draws)
    shared = Layout.under(args.work / "shared", args.work / "shared")
    if args.data:
        shared = dataclasses.replace(shared, data=args.data)
    job = open_job(base, shared)
    run_stage(Stage.PREPARE, base, shared, job=job)
    started = time.perf_counter()
    print(f"data: {run_stage(Stage.GENERATE, base, shared, job=job)} ({time.perf_counter() - started:.0f} s)",
          flush=True)

    results: dict[str, dict] = {}
    for variant in args.variants.split(","):
        config = dataclasses.replace(base, variant=variant)
        run_dir = args.work / variant
        shutil.rmtree(run_dir, ignore_errors=True)
        layout = dataclasses.replace(shared, train=run_dir / "train", drafter=run_dir / "train" / "drafter",
                                     metrics=run_dir / "train" / "metrics.jsonl", report=run_dir / "report.json")
        job = open_job(config, layout)
        started = time.perf_counter()
        run_stage(Stage.TRAIN, config, layout, job=job)
        train_seconds = time.perf_counter() - started
        run_stage(Stage.VALIDATE, config, layout, job=job)
        report = ValidationReport.load(layout.report)
        records = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
        results[variant] = {
            "tau": report.tau, "oracle_tau": report.oracle_tau, "per_position": report.tau_per_position,
            "by_category": {name: c.to_json() for name, c in (report.acceptance_by_category or {}).items()},
            "train_minutes": round(train_seconds / 60, 2),
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
