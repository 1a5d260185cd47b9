"""Bench: our drafters side by side with the open-source trainers that ship DFlash today, on the same data.

Peers: SpecForge 0.2.0 (DFlash), vLLM `speculators` 0.9.0 (DFlash and DFlash 2, with or without D-PACE), NeMo
Automodel 0.7.0 (DFlash and DFlash 2) and NVIDIA ModelOpt 0.47.0 (DFlash with D-PACE, one target tap per drafter
layer, so 3 layers against our 3-layer rows). Every trainer trains on one regenerated data set with the same
taps, mask token, block size, drafter layers, batch (sequences per step), anchors per sequence and optimizer
steps; a peer row runs either its authors' schedule (learning rate, warm-up, decay, optimizer, loss decay) or
ours (`bench.peers.peer_run.OUR_SCHEDULE`). Each peer lives in its own venv (`bash bench/setup/<peer>.sh`) and is driven
by bench/peers/<peer>_peer.py (SpecForge: bench/peers/specforge_peer.py), the CUDA-only calls of some overridden at run time by
a launcher of ours (never an edit to their sources). Each trainer runs as its own process under `nice` at
`--threads` threads; a row records that process's CPU seconds (its children included) and the load average
before and after, so rows stay comparable when other work shares the machine (wall time does not).

Budgets: equal steps (every row but the `*-cpu` ones: `--steps` optimizer steps) and, against SpecForge, equal
CPU time (`*-cpu` rows get the CPU seconds our DFlash 2 took at `--steps`, the `dflash2-steps` row, as the step
count their own equal-steps row says fits them, so each schedule still ends).

Every drafter, a peer's as its export wrote it, is judged twice on the built-in set's held-out prompts (66 at the
recipe's hold-out share; bench/heldout.py): by our replay, and by the reference `dflash` package's decoder
(bench/peers/reference_decode.py: its own `dflash_generate` against the target, which also checks the output against
the target's greedy continuation), each with a 95 % bootstrap interval and, against our row of the same variant
and depth, the paired interval of the tau ratio. A peer that fails to install, train or export is a row that says
why.

    bash bench/setup/specforge.sh                         # and speculators.sh, nemo_automodel.sh, modelopt.sh
    python -m bench.peers --data DATA --work WORK --rows specforge-steps,dflash-steps,dflash2-steps [--steps 300]
    python -m bench.peers --data DATA --work WORK --rows speculators-dflash2-dpace-authors,nemo-dflash2-authors
    python -m bench.peers --data DATA --work WORK --rows specforge-cpu,dflash-cpu
    python -m bench.peers --data DATA --work WORK --check-export specforge-steps   # lossless + `draftsmith validate`
    python -m bench.peers --work WORK --table

DATA: a data set from `draftsmith generate` or the main job's OUT/.work/data (with taps 1, 14, 27). Rows can run
in separate processes on the same WORK (two at once at most on two cores); results go to WORK/results.jsonl.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
)
from bench.peers import specforge_peer
from bench.peers.peer_run import (
    ENGINES,
    PEER_DTYPES,
    ROOT,
    PeerFailed,
    PeerRow,
    conversion_dir,
    conversion_dtype,
    resolve_peer_dtype,
    run_measured,
)
from trainer.atomic import work_lock


@dataclass(frozen=True)
class Row:
    trainer: str
    """`ours`, `specforge` or a peer driven by a module of PEER_MODULES."""
    variant: str
    """`dflash` or `dflash2`."""
    budget: str = "steps"
    """`steps` (--steps optimizer steps) or `cpu` (the CPU seconds of BUDGET_ROW)."""
    schedule: str = "authors"
    """The optimizer and learning-rate schedule: the trainer's own (`authors`; for our rows, ours) or `ours`."""
    layers: int | None = None
    """Drafter layers (None: --layers). A ModelOpt drafter taps one target layer per layer: 3 for 3 taps."""
    dpace: bool | None = None
    """D-PACE position weights on or off (None: the trainer's default)."""
    full_vocab_loss: bool = False
    """Ours only: cross-entropy over the whole vocabulary, as the peers train, not over our draft vocabulary."""


PEER_MODULES = {"speculators": "bench.peers.speculators_peer", "nemo_automodel": "bench.peers.nemo_automodel_peer",
                "modelopt": "bench.peers.modelopt_peer"}
TRAINER_NAMES = {"ours": "Draftsmith", "specforge": "SpecForge 0.2.0", "speculators": "vLLM speculators 0.9.0",
                 "nemo_automodel": "NeMo Automodel 0.7.0", "modelopt": "NVIDIA ModelOpt 0.47.0"}
ROWS = {
    "specforge-steps": Row("specforge", "dflash"),
    "dflash-steps": Row("ours", "dflash"),
    "dflash2-steps": Row("ours", "dflash2"),
    "specforge-cpu": Row("specforge", "dflash", budget="cpu"),
    "dflash-cpu": Row("ours", "dflash", budget="cpu"),
    "dflash-3l-steps": Row("ours", "dflash", layers=3),
    "dflash2-3l-steps": Row("ours", "dflash2", layers=3),
    "dflash-dpace-steps": Row("ours", "dflash", dpace=True),
    "dflash-3l-dpace-steps": Row("ours", "dflash", layers=3, dpace=True),  # ModelOpt's objective at its depth
    "dflash2-dpace-steps": Row("ours", "dflash2", dpace=True),
    "dflash2-dpace-fullvocab-steps": Row("ours", "dflash2", dpace=True, full_vocab_loss=True),  # the peers' loss
    **{f"speculators-{variant}{'-dpace' if dpace else ''}-{schedule}":
       Row("speculators", variant, schedule=schedule, dpace=dpace)
       for variant in ("dflash", "dflash2") for dpace in (True, False) for schedule in ("authors", "ours")},
    **{f"nemo-{variant}-{schedule}": Row("nemo_automodel", variant, schedule=schedule)
       for variant in ("dflash", "dflash2") for schedule in ("authors", "ours")},
    **{f"modelopt-dflash-dpace-{schedule}": Row("modelopt", "dflash", schedule=schedule, layers=3, dpace=True)
       for schedule in ("authors", "ours")},
}
BUDGET_ROW = "dflash2-steps"
"""The equal-CPU budget: the CPU seconds of our DFlash 2 at --steps (it is its own equal-CPU row)."""


def base_row(name: str, args, dpace: bool = False) -> str | None:
    """Our equal-steps row a row is judged against: ours of the same variant and drafter depth (None for our
    own rows and SpecForge's equal-CPU ones, tabled as before). With `dpace`, ours trained with D-PACE, and only
    for a peer row trained with D-PACE: the pair that asks whether the trainers differ at the same objective."""
    row = ROWS[name.split("+")[0]]
    if row.trainer == "ours" or row.budget != "steps" or (dpace and not row.dpace):
        return None
    layers = row.layers or args.layers
    depth = "" if layers == args.layers else f"-{layers}l"
    return f"{row.variant}{depth}{'-dpace' if dpace else ''}-steps"


def sizing_row(name: str, args) -> str:
    """The row whose CPU per step sizes an equal-CPU row: its own trainer's equal-steps row, or `--size-from` (a
    row of the same trainer measured on a quieter machine: CPU seconds per step rise with the load beside them)."""
    row = ROWS[name]
    return args.size_from or f"{'specforge' if row.trainer == 'specforge' else row.variant}-steps"


def steps_for(name: str, args, results: dict) -> int:
    if ROWS[name].budget == "steps":
        return args.steps
    sizing = sizing_row(name, args)
    reference = results.get(sizing)
    if BUDGET_ROW not in results or reference is None:
        raise SystemExit(f"{name} needs the rows {BUDGET_ROW} and {sizing} in {args.work}/results.jsonl first "
                         "(its CPU budget and its CPU per step)")
    budget_cpu = results[BUDGET_ROW]["train_cpu_s"]
    return max(1, round(reference["steps"] * budget_cpu / reference["train_cpu_s"]))


def drafter_config(target, variant: str, args, mask_token_id: int, layers: int):
    from trainer.drafter.config import DrafterConfig

    return DrafterConfig.for_target(target, variant=variant, num_layers=layers, block_size=args.block_size,
                                    mask_token_id=mask_token_id, target_layer_ids=args.taps)


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


def train_ours(name: str, row: Row, steps: int, args, env: dict) -> tuple[Path, dict]:
    """Our trainer exactly as a user runs it: `draftsmith train`, the recipe's defaults except what is aligned."""
    run_dir = fresh_dir(args.work / "rows" / name)
    command = [str(ROOT / ".venv" / "bin" / "draftsmith"), "train", "--target", str(args.target_dir), "--data",
               str(args.data), "--out", str(run_dir), "--variant", row.variant, "--num-layers",
               str(row.layers or args.layers), "--block-size", str(args.block_size), "--mask-token-id",
               str(args.mask_token_id), "--steps", str(steps), "--batch-size", str(args.batch_size), "--anchors",
               str(args.anchors), "--max-minutes", "100000", "--checkpoint-every", str(steps)]
    if row.dpace:
        command += ["--position-weighting", "dpace"]
    if row.full_vocab_loss:
        command.append("--full-vocab-loss")
    if args.seed is not None:
        command += ["--seed", str(args.seed)]
    status, cpu, wall = run_measured(command, args.work / "logs" / f"{name}.log", env)
    if status:
        raise PeerFailed(f"draftsmith train exited {status}; see {args.work / 'logs' / f'{name}.log'}")
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return run_dir / "drafter", {"steps": last["step"], "final_loss": last["loss"],
                                 "train_tau_estimate": last["train_tau_estimate"], "train_cpu_s": round(cpu, 1),
                                 "train_wall_s": round(wall, 1)}


def train_peer(name: str, row: Row, steps: int, args) -> tuple[Path, dict]:
    """A peer of PEER_MODULES through its module's `train(PeerRow, venv)` (bench/peers/peer_run.py)."""
    module = importlib.import_module(PEER_MODULES[row.trainer])
    venv = getattr(module, "DEFAULT_VENV", ENGINES / row.trainer)
    peer_row = PeerRow(
        name=name, variant=row.variant, schedule=row.schedule, steps=steps, target_dir=Path(args.target_dir),
        data_dir=args.data, work=args.work, row_dir=fresh_dir(args.work / "rows" / name),
        log=args.work / "logs" / f"{name}.log", taps=tuple(args.taps), layers=row.layers or args.layers,
        block_size=args.block_size, batch_size=args.batch_size, anchors=args.anchors,
        mask_token_id=args.mask_token_id, threads=args.threads,
        options={} if row.dpace is None else {"dpace": row.dpace}, dtype=args.peer_dtype)
    peer_row.row_dir.mkdir(parents=True)
    return module.train(peer_row, venv)


def train_specforge(name: str, steps: int, args, env: dict, target, store) -> tuple[Path, dict]:
    import yaml

    dtype = conversion_dtype(args.peer_dtype, specforge_peer.PUBLISHED_DTYPE)
    data_dir = conversion_dir(args.work, "specforge", args.peer_dtype)
    with work_lock(data_dir):
        converted = specforge_peer.convert_data(store, data_dir, args.taps, dtype)
    row_dir = fresh_dir(args.work / "rows" / name)
    row_dir.mkdir(parents=True)
    draft_path = row_dir / "draft_config.json"
    draft_path.write_text(json.dumps(specforge_peer.draft_config(
        drafter_config(target, "dflash", args, args.mask_token_id, args.layers), dtype), indent=1))
    config = specforge_peer.run_config(
        target_dir=args.target_dir, draft_config_path=draft_path, data_dir=data_dir,
        out_dir=row_dir / "run", samples=converted["samples"], steps=steps, batch_size=args.batch_size,
        anchors=args.anchors, mask_token_id=args.mask_token_id, max_length=args.max_length, dtype=dtype)
    config["training"].update(args.specforge_set)
    (row_dir / "run.yaml").write_text(yaml.safe_dump(config))
    log = args.work / "logs" / f"{name}.log"
    status, cpu, wall = run_measured(specforge_peer.train_command(args.specforge_venv, row_dir / "run.yaml"), log,
                                     specforge_peer.environment(args.threads) | {"PYTHONPATH": ""})
    if status:
        raise PeerFailed(f"specforge train exited {status}; see {log}")
    export_dir = row_dir / "export"
    exported = subprocess.run(specforge_peer.export_command(args.specforge_venv, row_dir / "run", draft_path,
                                                            export_dir, args.target_dir),
                              env=specforge_peer.environment(args.threads), capture_output=True, text=True)
    if exported.returncode:
        raise PeerFailed(f"specforge export failed:\n{exported.stdout[-2000:]}{exported.stderr[-2000:]}")
    losses = specforge_peer.losses(log.read_text())
    return export_dir, {"steps": losses[-1][0] if losses else steps, "final_loss": losses[-1][1] if losses else None,
                        "train_tau_estimate": None, "train_cpu_s": round(cpu, 1), "train_wall_s": round(wall, 1),
                        "samples": converted["samples"], "settings": config["training"]}


def run_row(name: str, args, target, store, references) -> dict:
    from trainer.drafter.checkpoint import load_drafter
    from trainer.validation.replay import replay_acceptance

    row = ROWS[name]
    steps = steps_for(name, args, load_results(args.work))
    sized_from = sizing_row(name, args) if row.budget == "cpu" else None
    if args.tag:  # a variant of the row (e.g. SpecForge with one of our settings), tabled against the plain rows
        name = f"{name}+{args.tag}"
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    record = {"row": name, "trainer": row.trainer, "variant": row.variant, "budget": row.budget,
              "schedule": row.schedule, "dpace": row.dpace, "full_vocab_loss": row.full_vocab_loss,
              "layers": row.layers or args.layers, "steps": steps,
              "threads": args.threads, "git": git_revision(), "uncommitted": uncommitted(),
              "peer_dtype": None if row.trainer == "ours" else args.peer_dtype,
              "aligned": {"taps": args.taps, "mask_token_id": args.mask_token_id, "block_size": args.block_size,
                          "layers": row.layers or args.layers, "batch_size": args.batch_size,
                          "anchors": args.anchors}}
    load_before = uptime_load()
    try:
        if row.trainer == "specforge":
            drafter_dir, trained = train_specforge(name, steps, args, env, target, store)
        elif row.trainer == "ours":
            drafter_dir, trained = train_ours(name, row, steps, args, env)
        else:
            drafter_dir, trained = train_peer(name, row, steps, args)
        drafter = load_drafter(drafter_dir)  # the export as the trainer wrote it: no conversion
    except (PeerFailed, OSError, ValueError, RuntimeError) as failure:  # the row says why; the others still run
        return record | {"failed": f"{type(failure).__name__}: {failure}"[:2000], "load_before": round(load_before, 2),
                         "load_after": round(uptime_load(), 2)}
    load_after = uptime_load()
    refs = references()
    record.update(drafter_dir=str(drafter_dir), **trained, **score_drafter(target, drafter, refs))
    if args.full_vocab and drafter.draft_vocab is not None:  # ours drafts over its draft vocabulary; over all:
        drafter.draft_vocab = None
        record["tau_full_vocab"] = round(replay_acceptance(target, drafter, refs).tau, 4)
    if args.reference_prompts:
        from bench.peers.reference_decode import reference_score

        record["reference"] = reference_score(target, Path(drafter_dir), refs, args.reference_prompts,
                                              args.reference_tokens)
    record.update(cpu_s_per_step=round(record["train_cpu_s"] / max(1, record["steps"]), 3),
                  load_before=round(load_before, 2), load_after=round(load_after, 2))
    if args.specforge_set and row.trainer == "specforge":
        record["specforge_set"] = args.specforge_set
    if sized_from:
        record["sized_from"] = sized_from
    return record


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
    if "failed" in row:
        raise SystemExit(f"{name} did not train: {row['failed']}")
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


def _ratio_cell(ours: dict | None, row: dict, key: str | None = None) -> str:
    """ours / row with its paired 95 % interval (over the prompts both were judged on), or blank."""
    if ours is None or ours is row or "failed" in ours:
        return ""
    a, b = (ours, row) if key is None else (ours.get(key), row.get(key))
    ratio = paired_ratio(a, b) if a and b else None
    return f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" if ratio else ""


def _tau_cell(result: dict) -> str:
    return f"{result['tau']:.3f} [{result['tau_ci95'][0]:.3f}, {result['tau_ci95'][1]:.3f}]"


def steps_table(rows: dict[str, dict], args) -> list[str]:
    """Every equal-steps row; a peer's judged against ours of the same variant and depth and against our DFlash 2."""
    out = ["**equal optimizer steps** (ours / this: the paired ratio of held-out tau; > 1 means ours accepts more)",
           "", "| row | trainer | variant | schedule | D-PACE | layers | steps | held-out tau, our replay [95% CI] | "
           "ours (same variant) / this | ours with D-PACE / this | our DFlash 2 / this | tau by the reference decoder [95% CI], mismatches | "
           "ours / this, reference decoder | per-position acceptance | CPU s/step | load before-after |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        if row["budget"] != "steps":
            continue
        # A peer trained in float32 where its authors use bfloat16 says so (bench/peers/peer_run.py PEER_DTYPES).
        precision = " (float32)" if row.get("peer_dtype") == "float32" else ""
        head = (f"| {name} | {TRAINER_NAMES.get(row['trainer'], row['trainer'])}{precision} | {row['variant']} | "
                f"{row.get('schedule', 'authors')} | {'default' if row.get('dpace') is None else row['dpace']} | "
                f"{row.get('layers', args.layers)} | {row['steps']} |")
        if "failed" in row:
            out.append(f"{head} did not run: {row['failed'].splitlines()[0][:300]} | | | | | | | | |")
            continue
        base = rows.get(base_row(name, args) or "")
        dpace_base = rows.get(base_row(name, args, dpace=True) or "")
        dflash2 = rows.get("dflash2-steps" if row.get("layers", args.layers) == args.layers else "dflash2-3l-steps")
        reference = row.get("reference")
        ref_cell = (f"{_tau_cell(reference)}, {len(reference['greedy_mismatches'])} of {reference['prompts']}"
                    if reference else "")
        positions = ", ".join(f"{a:.2f}" for a in row["per_position"][:4])
        out.append(f"{head} {_tau_cell(row)} | {_ratio_cell(base, row)} | {_ratio_cell(dpace_base, row)} | "
                   f"{_ratio_cell(dflash2 if row['trainer'] != 'ours' else None, row)} | {ref_cell} | "
                   f"{_ratio_cell(base, row, 'reference')} | {positions} | {row['cpu_s_per_step']:.2f} | "
                   f"{row['load_before']:.1f}-{row['load_after']:.1f} |")
    return out + [""]


def cpu_table(rows: dict[str, dict]) -> list[str]:
    """Equal CPU time against SpecForge: every row over SpecForge's row of that budget."""
    names = [n for n, r in rows.items() if r["budget"] == "cpu" and "failed" not in r]
    if not names:
        return []
    if BUDGET_ROW in rows:
        names.append(BUDGET_ROW)
    base = rows.get("specforge-cpu")
    out = ["**equal CPU time**", "", "| row | trainer | steps | held-out tau [95% CI] | tau / SpecForge's [paired 95% "
           "CI] | tau - SpecForge's [paired 95% CI] | per-position acceptance | oracle tau | train CPU s | CPU s/step "
           "| load before-after |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        row = rows[name]
        ratio = delta = ""
        if base is not None and name != base["row"]:
            r, d = paired_ratio(row, base), paired_delta(row, base)
            ratio = f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" if r else ""
            delta = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else ""
        positions = ", ".join(f"{a:.2f}" for a in row["per_position"][:4])
        out.append(f"| {name} | {TRAINER_NAMES[row['trainer']]} {row['variant']} | {row['steps']} | {_tau_cell(row)} "
                   f"| {ratio} | {delta} | {positions} | {row['oracle_tau']:.2f} | {row['train_cpu_s']:.0f} | "
                   f"{row['cpu_s_per_step']:.2f} | {row['load_before']:.1f}-{row['load_after']:.1f} |")
    return out + [""]


def print_table(work: Path, args) -> str:
    rows = load_results(work)
    table = "\n".join(steps_table(rows, args) + cpu_table(rows))
    print(table)
    return table


def main() -> None:
    from schemas import recipe

    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--peer-dtype", default="auto", choices=PEER_DTYPES,
                        help="The peers' training precision (bench/peers/peer_run.py PEER_DTYPES): auto is float32 on a CPU "
                             "without bfloat16 units, where our rows are float32 too.")
    parser.add_argument("--references", type=Path, default=None, help="Held-out references folder to reuse "
                                                                       "(default WORK/references).")
    parser.add_argument("--reference-prompts", type=int, default=24, help="Held-out prompts the reference `dflash` "
                        "decoder judges each drafter on (0: skip it).")
    parser.add_argument("--reference-tokens", type=int, default=64, help="New tokens per prompt there.")
    parser.add_argument("--specforge-venv", type=Path, default=specforge_peer.DEFAULT_VENV)
    parser.add_argument("--specforge-set", default="", help="SpecForge training settings to change, e.g. "
                                                            "'learning_rate=2e-3;warmup_ratio=0.5' (JSON values).")
    parser.add_argument("--size-from", default="", help="The row whose CPU seconds per step size the equal-CPU "
                        "rows (default: each trainer's own equal-steps row).")
    parser.add_argument("--seed", type=int, default=None, help="Our rows' training seed (default: the recipe's); "
                        "with --tag, a second seed of a row of ours, to size the spread between seeds.")
    parser.add_argument("--tag", default="", help="Record the rows as NAME+TAG (a variant; the plain rows stay).")
    parser.add_argument("--full-vocab", action="store_true", help="Also score our drafters drafting over the full "
                                                                   "vocabulary, as SpecForge's does (a second replay).")
    parser.add_argument("--check-export", default="", help="Rows whose exported drafter to check (lossless and "
                                                           "`draftsmith validate` as-is).")
    parser.add_argument("--check-prompts", type=int, default=16)
    parser.add_argument("--table", action="store_true", help="Only print the tables of the rows run so far.")
    args = parser.parse_args()
    if args.table:
        print_table(args.work, args)
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
    args.peer_dtype = resolve_peer_dtype(args.peer_dtype)
    args.specforge_set = {k: json.loads(v) for k, v in (item.split("=", 1)
                                                        for item in filter(None, args.specforge_set.split(";")))}
    args.target_dir = resolve_target_path(args.target)
    target = load_target_on(args.target_dir, args.device)
    store = DataStore.open(args.data)
    heldout_prompts(store.meta.prompt_ids)  # before any row trains
    args.mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)

    def references():
        return heldout_references(target, args.references or args.work / "references", store.meta.tap_layer_ids,
                                  store.meta.prompt_ids)

    for name in filter(None, args.rows.split(",")):
        row = run_row(name, args, target, store, references)
        append_result(args.work, row)
        if "failed" in row:
            print(f"{name}: did not run: {row['failed']}", flush=True)
            continue
        print(f"{name}: tau {row['tau']} {row['tau_ci95']} steps {row['steps']} cpu {row['train_cpu_s']} s "
              f"({row['cpu_s_per_step']} s/step) load {row['load_before']}-{row['load_after']}"
              + (f" reference tau {row['reference']['tau']}" if "reference" in row else ""), flush=True)
    for name in filter(None, args.check_export.split(",")):
        print(json.dumps(check_export(name, args, target, references(), args.check_prompts)), flush=True)
    print_table(args.work, args)


if __name__ == "__main__":
    sys.exit(main())
