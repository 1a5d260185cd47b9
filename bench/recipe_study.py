"""Bench: the recipe study. One regenerated data set, one change per row, equal training compute, and held-out
tau on every held-out prompt with a 95 % bootstrap interval over prompts (plus the paired difference against
the baseline row on the same prompts, which is what tells a real +0.05 from noise).

Held-out tau is measured by replay (trainer/validation/replay.py): the target decodes each held-out prompt
greedily once, and each drafter is then run against that known output, which is what greedy speculative
decoding does minus the target's verify passes. Training runs at `--threads` threads and every row records
its process CPU time, so rows stay comparable when other work shares the machine (wall time does not).

    python -m bench.recipe_study --data DATA --work /tmp/study --rows baseline,kl [--steps 300]
    python -m bench.recipe_study --work /tmp/study --table          # the table of every row run so far
    python -m bench.recipe_study --data DATA --work /tmp/dpace --rows bf16,dpace0.5 --seeds 3 --steps 150
    python -m bench.recipe_study --work /tmp/dpace --ratios         # each row / bf16, pooled over seeds

DATA is a data set from `draftsmith generate` (or the main job's OUT/.work/data) regenerated with the
teacher signal and with every tap a row needs (e.g. layers 1,14,27,29).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.heldout import (
    append_result,
    git_revision,
    heldout_prompts,
    heldout_references,
    load_results,
    paired_delta,
    score_drafter,
    uptime_load,
)

BF16 = {"bf16_matmuls": True}
ROWS: dict[str, tuple[str, dict, dict]] = {
    # name: (what changes, drafter-config overrides, training overrides). Every row after `bf16` keeps its
    # bfloat16 matmuls (1.5x the steps per CPU second) and changes one more thing against it.
    "baseline": ("the main job's recipe before this study (float32)", {}, {}),
    "bf16": ("bfloat16 matmuls (weights, optimizer, losses float32)", {}, BF16),
    "kl0.5": ("CE target: half token, half the target's top-32 distribution", {}, BF16 | {"kl_weight": 0.5}),
    "kl0.9": ("CE target: 0.1 token, 0.9 the target's top-32 distribution", {}, BF16 | {"kl_weight": 0.9}),
    "hidden1": ("+ regression onto the target's final hidden state (weight 1)", {},
                BF16 | {"hidden_loss_weight": 1.0}),
    "gamma1.5": ("position decay gamma 1.5 instead of 4 (weights ~ reach probability)", {},
                 BF16 | {"loss_decay_gamma": 1.5}),
    "gamma8": ("position decay gamma 8 (flatter)", {}, BF16 | {"loss_decay_gamma": 8.0}),
    "taps+29": ("taps [1,14,27,29]: the last layer (post-norm) added", {"target_layer_ids": (1, 14, 27, 29)}, BF16),
    "taps14,29": ("taps [1,14,29]: the last layer instead of 27", {"target_layer_ids": (1, 14, 29)}, BF16),
    "lr1e-3": ("peak lr 1e-3 instead of 2e-3", {}, BF16 | {"lr": 1e-3}),
    "lr4e-3": ("peak lr 4e-3 instead of 2e-3", {}, BF16 | {"lr": 4e-3}),
    "wd0.1": ("weight decay 0.1 instead of 0.01", {}, BF16 | {"weight_decay": 0.1}),
    "noise0.2": ("Gaussian noise 0.2 on the normed context features", {}, BF16 | {"context_noise": 0.2}),
    "rank64": ("selector rank 64 instead of 256", {"selector_rank": 64}, BF16),
    "sel0.3": ("selector loss weight 0.3 instead of 1", {}, BF16 | {"selector_loss_weight": 0.3}),
    "anchors24": ("24 anchors per sequence, 8 sequences per step (same positions per step)", {},
                  BF16 | {"anchors_per_sequence": 24, "batch_size": 8}),
    "anchors24k3": ("24 anchors per sequence, loss on block positions 1-3 only (the LM-head compute of 4-7 goes "
                    "to anchors; 0.83x the steps = equal compute)", {},
                    BF16 | {"anchors_per_sequence": 24, "supervised_positions": 3, "steps_factor": 0.83}),
    "layers1": ("1 drafter layer instead of 2 (cheaper drafts)", {"num_layers": 1}, BF16),
    # DFlash costs 1.96 CPU s/step against DFlash 2's 2.90 (bf16, 1 thread, 2026-12-01): equal compute is 1.48x
    # the steps. (`dflash-1.125x` is the row an earlier measurement, 2.39 against 2.69, sized.)
    "dflash": ("DFlash (v1): no convolutions, no selector; 1.48x the steps = DFlash 2's compute",
               {"variant": "dflash"}, BF16 | {"steps_factor": 1.48}),
    "dflash-1.125x": ("DFlash (v1) at 1.125x the steps (less than DFlash 2's compute)",
                      {"variant": "dflash"}, BF16 | {"steps_factor": 1.125}),
    "steps1.5x": ("1.5x the steps: bf16 at the float32 baseline's CPU time", {}, BF16 | {"steps_factor": 1.5}),
    # Issue 18's levers, each against `bf16` at the same steps (and, where the step cost differs, at equal CPU).
    "vocab-ce": ("cross-entropy over the 8,192-token draft vocabulary only (EAGLE-3), same steps", {},
                 BF16 | {"train_on_draft_vocab": True}),
    "auf": ("Spec-AUF: a block's CE stops after its first wrong prediction", {}, BF16 | {"first_failure_only": True}),
    "init-target": ("drafter layers initialised from the target's last layers", {}, BF16 | {"init": "target"}),
    # The position weighting (`decay`, the fixed exponential decay, is `bf16`'s) against D-PACE, whose weights come
    # from the drafter's own confidence; run with `--seeds 3` and read `--ratios`.
    "dpace0.3": ("D-PACE position weights, alpha 0.3", {}, BF16 | {"position_weighting": "dpace", "dpace_alpha": 0.3}),
    "dpace0.5": ("D-PACE position weights, alpha 0.5 (ModelOpt's default)", {},
                 BF16 | {"position_weighting": "dpace", "dpace_alpha": 0.5}),
    "dpace0.7": ("D-PACE position weights, alpha 0.7", {}, BF16 | {"position_weighting": "dpace", "dpace_alpha": 0.7}),
    "dpace0.5+acc": ("D-PACE alpha 0.5 + the expected-acceptance term (weight 0.5)", {},
                     BF16 | {"position_weighting": "dpace", "dpace_alpha": 0.5, "acceptance_loss_weight": 0.5}),
}


def parse_overrides(text: str) -> dict:
    """'key=value,key=value' with JSON values (numbers, lists) for ad-hoc rows."""
    out = {}
    for item in filter(None, text.split(";")):
        key, value = item.split("=", 1)
        out[key] = json.loads(value)
    return out


def seeded_name(name: str, seed: int | None) -> str:
    """A row's name in results.jsonl: `name@seed` for a seeded repeat, so the seeds of one row sit side by side."""
    return name if seed is None else f"{name}@{seed}"


def run_row(name: str, drafter_overrides: dict, train_overrides: dict, args, target, store, references,
            mask_token_id: int, seed: int | None = None) -> dict:
    import torch

    from trainer.drafter.checkpoint import load_drafter
    from trainer.drafter.config import DrafterConfig
    from trainer.training.config import TrainConfig
    from trainer.training.loop import Trainer
    from trainer.validation.replay import replay_acceptance

    drafter_overrides = dict(drafter_overrides)
    variant = drafter_overrides.pop("variant", "dflash2")
    num_layers = drafter_overrides.pop("num_layers", 2)
    taps = list(drafter_overrides.pop("target_layer_ids", (1, 14, 27)))
    config = DrafterConfig.for_target(target, variant=variant, num_layers=num_layers, block_size=args.block_size,
                                      mask_token_id=mask_token_id, target_layer_ids=taps, **drafter_overrides)
    train_overrides = dict(train_overrides)
    steps = round(args.steps * train_overrides.pop("steps_factor", 1.0))
    train = {"steps": steps, "max_minutes": None, "checkpoint_every": 10**6, **train_overrides}
    if seed is not None:
        train["seed"] = seed
    cfg = TrainConfig(**train)
    out_dir = args.work / "rows" / seeded_name(name, seed)
    records: list[dict] = []
    load_before, cpu_before, wall_before = uptime_load(), time.process_time(), time.perf_counter()
    Trainer(target, store, out_dir, config, cfg, [records.append]).run()
    cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    drafter = load_drafter(out_dir / "drafter")
    references = references()
    row = {
        "row": seeded_name(name, seed), "study_row": name, "seed": cfg.seed,
        "description": ROWS.get(name, ("ad hoc",))[0], "drafter": drafter_overrides | {
            "variant": variant, "num_layers": num_layers, "taps": taps}, "train": train,
        **score_drafter(target, drafter, references),
        "train_tau_estimate": records[-1]["train_tau_estimate"], "final_loss": records[-1]["loss"],
        "steps": records[-1]["step"], "train_cpu_s": round(cpu, 1), "train_wall_s": round(wall, 1),
        "cpu_s_per_step": round(cpu / max(1, len(records)), 3), "threads": torch.get_num_threads(),
        "load_before": round(load_before, 2), "load_after": round(uptime_load(), 2), "git": git_revision(),
    }
    if drafter.candidate_selector is not None and args.argmax:
        # The same drafter without its selector walk: plain argmax of its logits at every position.
        selector, drafter.candidate_selector = drafter.candidate_selector, None
        row["tau_argmax"] = round(replay_acceptance(target, drafter, references).tau, 4)
        drafter.candidate_selector = selector
    if args.sampled_prompts:  # tau under speculative sampling at T=1, same prompts and seeds for every row
        from bench.sampled_tau import sampled_tau
        from schemas import recipe
        from trainer.data.prompts import load_prompts, split_prompts

        holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)[1]
        sampled = sampled_tau(target, drafter, holdout[:args.sampled_prompts])
        row.update(tau_t1=sampled["tau"], tau_t1_per_prompt=sampled["per_prompt"])
    return row


def sampled_cell(row: dict, base: dict | None) -> str:
    """T=1 tau (speculative sampling, `--sampled-prompts`) and its paired difference to `base` on the same
    prompts and seeds; empty when the row was not sampled."""
    if "tau_t1" not in row:
        return ""
    cell = f"{row['tau_t1']:.3f}"
    if base is not None and "tau_t1" in base:
        sampled = paired_delta(*({"tau": r["tau_t1"], "per_prompt": r["tau_t1_per_prompt"]} for r in (row, base)))
        if sampled is not None:
            cell += f" ({sampled[0]:+.3f} [{sampled[1]:+.3f}, {sampled[2]:+.3f}])"
    return cell


def print_table(work: Path, baseline: str = "baseline") -> str:
    rows = load_results(work)
    lines = ["| row | what changes | held-out tau [95% CI] | delta [paired 95% CI] | per-position "
             "acceptance | argmax tau | T=1 tau (delta [paired 95% CI]) | oracle tau | train-set tau | steps | "
             "CPU s/step | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        delta = ""
        # Each row against the row it changes one thing of: bf16 against the float32 baseline, the rest
        # against bf16 (they keep its bfloat16 matmuls), `reference` naming any other.
        study_row, seed = row.get("study_row", name), row.get("seed")
        reference = row.get("reference") or ("bf16" if row["train"].get("bf16_matmuls") and study_row != "bf16"
                                             else baseline)
        # A seeded repeat is set against the reference's run with the same seed where there is one.
        base = rows.get(seeded_name(reference, seed)) if "study_row" in row else None
        base = base or rows.get(reference)
        reference = base["row"] if base is not None else reference
        delta_ci = paired_delta(row, base) if base is not None and name != reference else None
        if delta_ci is not None:
            delta = f"{delta_ci[0]:+.3f} [{delta_ci[1]:+.3f}, {delta_ci[2]:+.3f}] vs {reference}"
        positions = ", ".join(f"{a:.2f}" for a in row["per_position"][:4])
        sampled = sampled_cell(row, base if name != reference else None)
        lines.append(f"| {name} | {row['description']} | {row['tau']:.3f} [{row['tau_ci95'][0]:.3f}, "
                     f"{row['tau_ci95'][1]:.3f}] | {delta} | {positions} | {row.get('tau_argmax', '')} | "
                     f"{sampled} | {row['oracle_tau']:.2f} | {row['train_tau_estimate']:.2f} | {row['steps']} | "
                     f"{row['cpu_s_per_step']:.2f} | {row['load_before']:.1f}-{row['load_after']:.1f} |")
    table = "\n".join(lines)
    print(table)
    return table


def seed_pooled_ratio(runs: list[dict], references: list[dict], draws: int = 4000,
                      seed: int = 0) -> tuple[float, float, float] | None:
    """tau(row) / tau(reference) over all seeds of both, with a 95 % interval from a two-level bootstrap
    (trainer/bootstrap.py `seed_pooled_ratio_interval`): each draw resamples the training seeds of each side
    (independent runs) and the held-out prompts (shared by both sides, so the prompt difficulty cancels in the
    ratio). None when the runs were not all scored on the same prompts."""
    from trainer.bootstrap import ratio_of_sums, seed_pooled_ratio_interval

    if not runs or not references:
        return None
    count = len(runs[0]["per_prompt"])
    if any(len(r["per_prompt"]) != count for r in runs + references):
        return None
    mine, theirs = [r["per_prompt"] for r in runs], [r["per_prompt"] for r in references]
    point = ratio_of_sums([p for run in mine for p in run]) / ratio_of_sums([p for run in theirs for p in run])
    low, high = seed_pooled_ratio_interval(mine, theirs, draws=draws, seed=seed)
    return point, low, high


def print_ratios(work: Path, reference: str = "bf16") -> str:
    """Each seeded study row's tau against `reference` pooled over seeds, with the seed-and-prompt interval, and
    the verdict the default rule reads: a change becomes the default only if the whole interval lies above 1."""
    by_row: dict[str, list[dict]] = {}
    for row in load_results(work).values():
        if row.get("seed") is not None and "study_row" in row:
            by_row.setdefault(row["study_row"], []).append(row)
    base = by_row.get(reference, [])
    lines = [f"| row | seeds | tau (mean of seeds) | tau / {reference} [95 % CI, seeds and prompts] | CPU s/step | "
             "verdict |", "|---|---|---|---|---|---|"]
    for name, runs in by_row.items():
        mean_tau = sum(r["tau"] for r in runs) / len(runs)
        cpu = sum(r["cpu_s_per_step"] for r in runs) / len(runs)
        ratio = seed_pooled_ratio(runs, base) if name != reference else None
        if ratio is None:
            cell, verdict = "", "reference" if name == reference else "not comparable"
        else:
            cell = f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]"
            verdict = ("better: interval above 1" if ratio[1] > 1 else
                       "worse: interval below 1" if ratio[2] < 1 else "no difference shown")
        lines.append(f"| {name} | {len(runs)} | {mean_tau:.3f} | {cell} | {cpu:.2f} | {verdict} |")
    table = "\n".join(lines)
    print(table)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--data", type=Path, help="A regenerated data set with a teacher signal and every tap.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/draftsmith-study"))
    parser.add_argument("--rows", default="baseline", help=f"Comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--adhoc", default="", help="An extra row: NAME:drafter k=v;...:train k=v;...")
    parser.add_argument("--steps", type=int, default=None, help="Default: the recipe's steps.")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-max-new-tokens", type=int, default=None)
    parser.add_argument("--table", action="store_true", help="Only print the table of the rows run so far.")
    parser.add_argument("--seeds", type=int, default=0,
                        help="Train every row with seeds 0..N-1 (rows named ROW@SEED); --ratios pools them.")
    parser.add_argument("--ratios", action="store_true",
                        help="Only print each seeded row's tau ratio against bf16, pooled over seeds.")
    parser.add_argument("--sampled-prompts", type=int, default=0,
                        help="Also measure tau under speculative sampling at T=1 on this many held-out prompts.")
    parser.add_argument("--argmax", action="store_true", help="Also measure each DFlash 2 drafter without its "
                                                                "selector walk (plain argmax).")
    args = parser.parse_args()
    if args.table:
        print_table(args.work)
        return
    if args.ratios:
        print_ratios(args.work)
        return

    import torch

    torch.set_num_threads(args.threads)
    from schemas import recipe
    from trainer.data.store import DataStore
    from trainer.device import load_target_on
    from trainer.targets.bundled import resolve_target_path
    from trainer.targets.chat import choose_mask_token_id

    args.steps = args.steps or recipe.TRAIN_STEPS
    args.block_size = args.block_size or recipe.BLOCK_SIZE
    target = load_target_on(resolve_target_path(args.target), args.device)
    store = DataStore.open(args.data)
    heldout_prompts(store.meta.prompt_ids)  # before any row trains

    def references():
        """Decoded after the first row trains, so a study starts training at once."""
        return heldout_references(target, args.work / "references", store.meta.tap_layer_ids,
                                  store.meta.prompt_ids, args.eval_max_new_tokens)

    mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)
    todo = [(name, *ROWS[name][1:]) for name in filter(None, args.rows.split(","))]
    if args.adhoc:
        name, drafter_part, train_part = args.adhoc.split(":")
        todo.append((name, parse_overrides(drafter_part), parse_overrides(train_part)))
    seeds = list(range(args.seeds)) if args.seeds else [None]
    # Seed-major: every row's first seed before any second, so a study cut short still compares all rows.
    for seed in seeds:
        for name, drafter_overrides, train_overrides in todo:
            row = run_row(name, drafter_overrides, train_overrides, args, target, store, references, mask_token_id,
                          seed)
            append_result(args.work, row)
            print(f"{row['row']}: tau {row['tau']} {row['tau_ci95']} per-position {row['per_position'][:4]} "
                  f"argmax {row.get('tau_argmax')} cpu/step {row['cpu_s_per_step']}", flush=True)
    print_table(args.work)
    if args.seeds:
        print_ratios(args.work)


if __name__ == "__main__":
    main()
