"""Bench: our drafters side by side with SpecForge's DFlash (the open-source trainer) on the same data and compute.

SpecForge 0.2.0 (DFlash only), our DFlash and our DFlash 2 train on one regenerated data set with the same taps,
mask token, block size, drafter layers, batch (sequences per step) and anchors per sequence; SpecForge keeps its
own published recipe wherever ours differs (learning rate and schedule, optimizer, loss decay, weight dtype,
init: see docs/PEERS.md). Each trainer runs as its own process under `nice` at `--threads` threads, and a
row records that process's CPU seconds (its children included) and the load average before and after, so rows
stay comparable when other work shares the machine (wall time does not). Two budgets:

- equal steps (`*-steps` rows): every trainer runs `--steps` optimizer steps;
- equal CPU time (`*-cpu` rows): every trainer gets the CPU seconds our DFlash 2 took at `--steps` (the
  `dflash2-steps` row), as the step count its own equal-steps row says fits them, so its schedule still ends.

Every drafter, SpecForge's as `specforge export --to hf` wrote it, is scored by our replay on the built-in set's
held-out prompts (66 at the recipe's hold-out share; bench/heldout.py) with a 95 % bootstrap interval, and each row
against SpecForge's row of the same budget with paired intervals (difference and ratio of tau).

    bash bench/setup/specforge.sh                         # SpecForge in .engines/specforge (its own venv)
    python -m bench.peers --data DATA --work WORK --rows specforge-steps,dflash-steps,dflash2-steps [--steps 300]
    python -m bench.peers --data DATA --work WORK --rows specforge-cpu,dflash-cpu
    python -m bench.peers --data DATA --work WORK --check-export specforge-steps   # lossless + `draftsmith validate`
    python -m bench.peers --work WORK --table

DATA: a data set from `draftsmith generate` or the main job's OUT/.work/data (with taps 1, 14, 27). Rows can run
in separate processes on the same WORK (two at once at most on two cores); results go to WORK/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import specforge_peer
from bench.heldout import (
    append_result,
    git_revision,
    heldout_prompts,
    heldout_references,
    load_results,
    paired_delta,
    paired_ratio,
    score_drafter,
    uncommitted,
    uptime_load,
    work_lock,
)

ROOT = Path(__file__).resolve().parent.parent
ROWS = {
    # name: (trainer, variant, budget)
    "specforge-steps": ("specforge", "dflash", "steps"),
    "dflash-steps": ("ours", "dflash", "steps"),
    "dflash2-steps": ("ours", "dflash2", "steps"),
    "specforge-cpu": ("specforge", "dflash", "cpu"),
    "dflash-cpu": ("ours", "dflash", "cpu"),
}
BUDGET_ROW = "dflash2-steps"
"""The equal-CPU budget: the CPU seconds of our DFlash 2 at --steps (it is its own equal-CPU row)."""


def run_measured(command: list[str], log: Path, env: dict) -> tuple[int, float, float]:
    """Run `command` under nice; (exit status, CPU seconds of the process and its children, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(["nice", "-n", "10", *command], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=ROOT)
        # wait4 gives this child's own rusage, which includes every descendant it waited for.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime, time.perf_counter() - started


def sizing_row(name: str, args) -> str:
    """The row whose CPU per step sizes an equal-CPU row: its own trainer's equal-steps row, or `--size-from` (a
    row of the same trainer measured on a quieter machine: CPU seconds per step rise with the load beside them)."""
    trainer, variant, _ = ROWS[name]
    return args.size_from or f"{'specforge' if trainer == 'specforge' else variant}-steps"


def steps_for(name: str, args, results: dict) -> int:
    if ROWS[name][2] == "steps":
        return args.steps
    sizing = sizing_row(name, args)
    reference = results.get(sizing)
    if BUDGET_ROW not in results or reference is None:
        raise SystemExit(f"{name} needs the rows {BUDGET_ROW} and {sizing} in {args.work}/results.jsonl first "
                         "(its CPU budget and its CPU per step)")
    budget_cpu = results[BUDGET_ROW]["train_cpu_s"]
    return max(1, round(reference["steps"] * budget_cpu / reference["train_cpu_s"]))


def drafter_config(target, variant: str, args, mask_token_id: int):
    from trainer.drafter.config import DrafterConfig

    return DrafterConfig.for_target(target, variant=variant, num_layers=args.layers, block_size=args.block_size,
                                    mask_token_id=mask_token_id, target_layer_ids=args.taps)


def train_ours(name: str, variant: str, steps: int, args, env: dict) -> tuple[Path, dict]:
    """Our trainer exactly as a user runs it: `draftsmith train`, the recipe's defaults except what is aligned."""
    run_dir = args.work / "rows" / name
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    command = [str(ROOT / ".venv" / "bin" / "draftsmith"), "train", "--target", str(args.target_dir), "--data",
               str(args.data), "--out", str(run_dir), "--variant", variant, "--num-layers", str(args.layers),
               "--block-size", str(args.block_size), "--mask-token-id", str(args.mask_token_id), "--steps",
               str(steps), "--batch-size", str(args.batch_size), "--anchors", str(args.anchors),
               "--max-minutes", "100000", "--checkpoint-every", str(steps)]
    status, cpu, wall = run_measured(command, args.work / "logs" / f"{name}.log", env)
    if status:
        raise SystemExit(f"{name}: draftsmith train exited {status}; see {args.work / 'logs' / f'{name}.log'}")
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return run_dir / "drafter", {"steps": last["step"], "final_loss": last["loss"],
                                 "train_tau_estimate": last["train_tau_estimate"], "train_cpu_s": round(cpu, 1),
                                 "train_wall_s": round(wall, 1)}


def train_specforge(name: str, steps: int, args, env: dict, target, store) -> tuple[Path, dict]:
    import yaml

    with work_lock(args.work / "specforge-data"):
        converted = specforge_peer.convert_data(store, args.work / "specforge-data", args.taps)
    row_dir = args.work / "rows" / name
    if row_dir.exists():
        import shutil

        shutil.rmtree(row_dir)
    row_dir.mkdir(parents=True)
    draft_path = row_dir / "draft_config.json"
    draft_path.write_text(json.dumps(specforge_peer.draft_config(
        drafter_config(target, "dflash", args, args.mask_token_id)), indent=1))
    config = specforge_peer.run_config(
        target_dir=args.target_dir, draft_config_path=draft_path, data_dir=args.work / "specforge-data",
        out_dir=row_dir / "run", samples=converted["samples"], steps=steps, batch_size=args.batch_size,
        anchors=args.anchors, mask_token_id=args.mask_token_id, max_length=args.max_length)
    config["training"].update(args.specforge_set)
    (row_dir / "run.yaml").write_text(yaml.safe_dump(config))
    log = args.work / "logs" / f"{name}.log"
    status, cpu, wall = run_measured(specforge_peer.train_command(args.specforge_venv, row_dir / "run.yaml"), log,
                                     specforge_peer.environment(args.threads) | {"PYTHONPATH": ""})
    if status:
        raise SystemExit(f"{name}: specforge train exited {status}; see {log}")
    export_dir = row_dir / "export"
    exported = subprocess.run(specforge_peer.export_command(args.specforge_venv, row_dir / "run", draft_path,
                                                            export_dir, args.target_dir),
                              env=specforge_peer.environment(args.threads), capture_output=True, text=True)
    if exported.returncode:
        raise SystemExit(f"{name}: specforge export failed:\n{exported.stdout[-2000:]}{exported.stderr[-2000:]}")
    losses = specforge_peer.losses(log.read_text())
    return export_dir, {"steps": losses[-1][0] if losses else steps, "final_loss": losses[-1][1] if losses else None,
                        "train_tau_estimate": None, "train_cpu_s": round(cpu, 1), "train_wall_s": round(wall, 1),
                        "samples": converted["samples"], "settings": config["training"]}


def run_row(name: str, args, target, store, references) -> dict:
    from trainer.drafter.checkpoint import load_drafter
    from trainer.validation.replay import replay_acceptance

    trainer, variant, budget = ROWS[name]
    steps = steps_for(name, args, load_results(args.work))
    sized_from = sizing_row(name, args) if budget == "cpu" else None
    if args.tag:  # a variant of the row (e.g. SpecForge with one of our settings), tabled against the plain rows
        name = f"{name}+{args.tag}"
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    load_before = uptime_load()
    if trainer == "specforge":
        drafter_dir, trained = train_specforge(name, steps, args, env, target, store)
    else:
        drafter_dir, trained = train_ours(name, variant, steps, args, env)
    load_after = uptime_load()
    drafter = load_drafter(drafter_dir)  # SpecForge's export as it wrote it: no conversion
    refs = references()
    row = {"row": name, "trainer": trainer, "variant": variant, "budget": budget, "drafter_dir": str(drafter_dir),
           **trained, **score_drafter(target, drafter, refs)}
    if args.full_vocab and drafter.draft_vocab is not None:  # ours drafts over its draft vocabulary; over all:
        drafter.draft_vocab = None
        row["tau_full_vocab"] = round(replay_acceptance(target, drafter, refs).tau, 4)
    row.update(cpu_s_per_step=round(row["train_cpu_s"] / max(1, row["steps"]), 3), threads=args.threads,
               load_before=round(load_before, 2), load_after=round(load_after, 2), git=git_revision(),
               uncommitted=uncommitted(),
               aligned={"taps": args.taps, "mask_token_id": args.mask_token_id, "block_size": args.block_size,
                        "layers": args.layers, "batch_size": args.batch_size, "anchors": args.anchors})
    if args.specforge_set and trainer == "specforge":
        row["specforge_set"] = args.specforge_set
    if sized_from:
        row["sized_from"] = sized_from
    return row


def check_export(name: str, args, target, references, prompts: int) -> dict:
    """The row's drafter as exported, loaded as written: greedy speculative output at its block size equal to the
    target's on `prompts` held-out prompts (our decoder against the references, token for token), and the
    validate stage's measurement (`trainer.validation.report.validate`, what `draftsmith validate` runs, without
    its serving-engine step) on 6 held-out prompts with a 60-draw sampling test."""
    from schemas import recipe
    from schemas.sampling import SamplingParams
    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.drafter.checkpoint import load_drafter
    from trainer.speculative import SpeculativeDecoder
    from trainer.validation.report import validate

    row = load_results(args.work)[name]
    drafter = load_drafter(Path(row["drafter_dir"]))
    decoder = SpeculativeDecoder(target, drafter)
    mismatches = []
    for reference in references[:prompts]:
        out = decoder.generate(reference.tokens[:reference.prompt_len], SamplingParams(temperature=0.0),
                               max_new_tokens=reference.max_new_tokens)
        if out.tokens != reference.tokens[reference.prompt_len:]:
            mismatches.append(reference.prompt_id)
    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    report = validate(target, drafter, holdout[:6], SamplingParams(), sampling_draws=60)
    check = {"row": name, "drafter_dir": row["drafter_dir"], "greedy_prompts": prompts,
             "block_size": decoder.block_size, "greedy_mismatches": mismatches, "validate_passed": report.passed,
             "validate_tau": report.tau, "validate_lossless": report.lossless.to_json(),
             "recommended_block_size": report.recommended_block_size}
    (args.work / "checks").mkdir(parents=True, exist_ok=True)
    (args.work / "checks" / f"{name}.json").write_text(json.dumps(check, indent=1, default=str))
    return check


def print_table(work: Path) -> str:
    rows = load_results(work)
    out = []
    for budget, title in (("steps", "equal optimizer steps"), ("cpu", "equal CPU time")):
        names = [n for n, r in rows.items() if r["budget"] == budget]
        if budget == "cpu" and BUDGET_ROW in rows:
            names.append(BUDGET_ROW)
        if not names:
            continue
        base = rows.get(f"specforge-{budget}")
        out += [f"**{title}**", "", "| row | trainer | steps | held-out tau [95% CI] | tau / SpecForge's [paired 95% "
                "CI] | tau - SpecForge's [paired 95% CI] | per-position acceptance | oracle tau | train CPU s | CPU "
                "s/step | load before-after |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in names:
            row = rows[name]
            ratio = delta = ""
            if base is not None and name != base["row"]:
                r, d = paired_ratio(row, base), paired_delta(row, base)
                ratio = f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" if r else ""
                delta = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else ""
            who = {"specforge": "SpecForge 0.2.0 DFlash", "ours": f"Draftsmith {row['variant']}"}[row["trainer"]]
            tau = f"{row['tau']:.3f} [{row['tau_ci95'][0]:.3f}, {row['tau_ci95'][1]:.3f}]"
            if "tau_full_vocab" in row:
                tau += f" (full vocabulary {row['tau_full_vocab']:.3f})"
            positions = ", ".join(f"{a:.2f}" for a in row["per_position"][:4])
            out.append(f"| {name} | {who} | {row['steps']} | {tau} | {ratio} | {delta} | {positions} | "
                       f"{row['oracle_tau']:.2f} | {row['train_cpu_s']:.0f} | {row['cpu_s_per_step']:.2f} | "
                       f"{row['load_before']:.1f}-{row['load_after']:.1f} |")
        out.append("")
    table = "\n".join(out)
    print(table)
    return table


def main() -> None:
    from schemas import recipe

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m", help="Bundled name or an HF directory.")
    parser.add_argument("--data", type=Path, help="A regenerated data set (draftsmith generate / OUT/.work/data).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/draftsmith-peers"))
    parser.add_argument("--rows", default="", help=f"Comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--steps", type=int, default=300, help="Optimizer steps of the equal-steps rows.")
    parser.add_argument("--taps", default="1,14,27", help="Target layers every drafter taps.")
    parser.add_argument("--layers", type=int, default=recipe.NUM_LAYERS)
    parser.add_argument("--block-size", type=int, default=recipe.BLOCK_SIZE)
    parser.add_argument("--batch-size", type=int, default=recipe.BATCH_SIZE, help="Sequences per step.")
    parser.add_argument("--anchors", type=int, default=recipe.ANCHORS_PER_SEQUENCE, help="Blocks per sequence.")
    parser.add_argument("--max-length", type=int, default=2048, help="SpecForge's data.max_length.")
    parser.add_argument("--threads", type=int, default=1, help="Threads of each training process.")
    parser.add_argument("--references", type=Path, default=None, help="Held-out references folder to reuse "
                                                                       "(default WORK/references).")
    parser.add_argument("--specforge-venv", type=Path, default=specforge_peer.DEFAULT_VENV)
    parser.add_argument("--specforge-set", default="", help="SpecForge training settings to change, e.g. "
                                                            "'learning_rate=2e-3;warmup_ratio=0.5' (JSON values).")
    parser.add_argument("--size-from", default="", help="The row whose CPU seconds per step size the equal-CPU "
                        "rows (default: each trainer's own equal-steps row).")
    parser.add_argument("--tag", default="", help="Record the rows as NAME+TAG (a variant; the plain rows stay).")
    parser.add_argument("--full-vocab", action="store_true", help="Also score our drafters drafting over the full "
                                                                   "vocabulary, as SpecForge's does (a second replay).")
    parser.add_argument("--check-export", default="", help="Rows whose exported drafter to check (lossless and "
                                                           "`draftsmith validate` as-is).")
    parser.add_argument("--check-prompts", type=int, default=16)
    parser.add_argument("--table", action="store_true", help="Only print the tables of the rows run so far.")
    args = parser.parse_args()
    if args.table:
        print_table(args.work)
        return
    unknown = [n for n in filter(None, args.rows.split(",")) if n not in ROWS]
    if unknown or not args.data:
        raise SystemExit(f"unknown rows {unknown}; choose from {list(ROWS)}" if unknown else "--data is required")

    import torch

    torch.set_num_threads(args.threads)
    from trainer.data.store import DataStore
    from trainer.device import load_target_on
    from trainer.targets.bundled import resolve_target_path
    from trainer.targets.chat import choose_mask_token_id

    args.taps = [int(t) for t in args.taps.split(",")]
    args.specforge_set = {k: json.loads(v) for k, v in (item.split("=", 1)
                                                        for item in filter(None, args.specforge_set.split(";")))}
    args.target_dir = resolve_target_path(args.target)
    target = load_target_on(args.target_dir, args.device)
    store = DataStore.open(args.data)
    heldout_prompts(store.meta["prompt_ids"])  # before any row trains
    args.mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)

    def references():
        return heldout_references(target, args.references or args.work / "references", store.meta["tap_layer_ids"],
                                  store.meta["prompt_ids"])

    for name in filter(None, args.rows.split(",")):
        row = run_row(name, args, target, store, references)
        append_result(args.work, row)
        print(f"{name}: tau {row['tau']} {row['tau_ci95']} steps {row['steps']} cpu {row['train_cpu_s']} s "
              f"({row['cpu_s_per_step']} s/step) load {row['load_before']}-{row['load_after']}", flush=True)
    for name in filter(None, args.check_export.split(",")):
        print(json.dumps(check_export(name, args, target, references(), args.check_prompts)), flush=True)
    print_table(args.work)


if __name__ == "__main__":
    sys.exit(main())
