"""`draftsmith` commands that drive the ML library directly (no service needed)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from trainer.errors import DraftsmithError
from trainer.validation import SAMPLING_DRAWS, VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS


def user_errors(command):
    """Print a DraftsmithError as one line and exit 2, instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except DraftsmithError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(2)

    return wrapper


@click.group()
def target() -> None:
    """Prepare and inspect target models."""


@target.command("prepare")
@click.argument("name")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory to write.")
@user_errors
def target_prepare(name: str, out_dir: Path) -> None:
    """Materialise a bundled target (e.g. smollm2-135m) as a plain HF directory, offline."""
    from trainer.targets.bundled import prepare_bundled

    click.echo(prepare_bundled(name, out_dir))


@target.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--allow-pickle", is_flag=True, help="Accept pickle (*.bin) weights. Never for untrusted files.")
@user_errors
def target_inspect(path: Path, allow_pickle: bool) -> None:
    """Check a target directory and print what a drafter would be built from."""
    from trainer.targets import load_target
    from trainer.targets.chat import choose_mask_token_id

    loaded = load_target(path, allow_pickle=allow_pickle)
    mask_token_id, reason = choose_mask_token_id(loaded.tokenizer, loaded.vocab_size)
    click.echo(json.dumps({
        "model_type": loaded.config.model_type, "num_layers": loaded.num_layers,
        "hidden_size": loaded.hidden_size, "vocab_size": loaded.vocab_size,
        "tied_embeddings": bool(getattr(loaded.config, "tie_word_embeddings", False)),
        "mask_token_id": mask_token_id, "mask_token_rule": reason,
        "stop_token_ids": loaded.stop_token_ids(), "fingerprint": loaded.fingerprint,
    }, indent=2))


@click.command()
@click.option("--target", "target_dir", type=click.Path(path_type=Path), required=True)
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), default=None,
              help="Drafter directory; without it the target decodes alone.")
@click.option("--prompt", required=True, help="User message, rendered with the target's chat template.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--top-k", default=0, show_default=True)
@click.option("--block-size", default=None, type=int, help="Defaults to the drafter's.")
@click.option("--seed", default=0, show_default=True)
@user_errors
def decode(target_dir, drafter_dir, prompt, max_new_tokens, temperature, top_p, top_k, block_size, seed) -> None:
    """Generate one response, speculatively when a drafter is given, and print tau and speed."""
    import torch

    from schemas.sampling import SamplingParams
    from trainer.drafter.checkpoint import load_drafter
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets import load_target
    from trainer.targets.chat import render_prompt

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                            seed=seed)
    loaded = load_target(target_dir)
    drafter = load_drafter(drafter_dir, loaded.device, loaded.dtype) if drafter_dir else None
    decoder = SpeculativeDecoder(loaded, drafter, block_size)
    ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": prompt}], params.chat_template)
    result = decoder.generate(ids, params, generator=torch.Generator().manual_seed(seed))
    click.echo(loaded.tokenizer.decode(result.tokens, skip_special_tokens=True))
    seconds = result.prefill_seconds + result.decode_seconds
    click.echo(f"[{len(result.tokens)} tokens, tau {result.tau:.2f}, {len(result.tokens) / seconds:.1f} tokens/s]",
               err=True)


def train_default(name: str, main_job: bool = False):
    """CLI defaults come from trainer/training/config.py, the one place they are set (no torch import):
    TrainConfig's, or MAIN_JOB_TRAINING's for `draftsmith run`."""
    from trainer.training.config import MAIN_JOB_TRAINING, TrainConfig

    return getattr(MAIN_JOB_TRAINING if main_job else TrainConfig(), name)


def sampling_options(command):
    """The job's sampling parameters, shared by every command that generates."""
    options = [
        click.option("--temperature", default=0.0, show_default=True, help="0 is greedy."),
        click.option("--top-p", default=1.0, show_default=True),
        click.option("--top-k", default=0, show_default=True, help="0 disables."),
        click.option("--max-new-tokens", default=128, show_default=True),
        click.option("--seed", default=0, show_default=True),
        click.option("--enable-thinking/--disable-thinking", default=None,
                     help="Chat-template switch for reasoning models; default: the template's own."),
        click.option("--system-prompt", default=None, help="System message for prompts that have none."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def make_sampling(temperature, top_p, top_k, max_new_tokens, seed, enable_thinking, system_prompt):
    from pydantic import ValidationError

    from schemas.sampling import ChatTemplateOptions, SamplingParams

    try:
        return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                              seed=seed, chat_template=ChatTemplateOptions(enable_thinking=enable_thinking,
                                                                           system_prompt=system_prompt))
    except ValidationError as exc:
        error = exc.errors()[0]
        raise click.BadParameter(f"{error['loc'][-1]}: {error['msg']}") from None


def tap_layers(target, num_layers: int, target_layers: str | None) -> list[int]:
    from trainer.drafter.config import default_target_layer_ids

    if target_layers:
        return [int(x) for x in target_layers.split(",")]
    return default_target_layer_ids(target.num_layers, num_layers)


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name (smollm2-135m).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Data directory.")
@click.option("--prompts", default="builtin", show_default=True, help="builtin, or a .jsonl/.parquet prompts file.")
@click.option("--num-prompts", default=None, type=int, help="Use at most this many training prompts.")
@click.option("--holdout", default=0.1, show_default=True, help="Share of prompts kept for validation.")
@click.option("--num-layers", default=2, show_default=True, help="Drafter layers (sets how many taps are cached).")
@click.option("--target-layers", default=None, help="Comma-separated target layer ids to tap (overrides the rule).")
@click.option("--cache-budget-mb", default=4096, show_default=True,
              help="Cache hidden states with the data up to this size; above it training recomputes them.")
@click.option("--batch-size", default=32, show_default=True, help="Prompts generated together.")
@sampling_options
@user_errors
def generate(target_spec, out_dir, prompts, num_prompts, holdout, num_layers, target_layers, cache_budget_mb,
             batch_size, **sampling) -> None:
    """Regenerate responses to the training prompts with the target (resumable by shard)."""
    from tqdm import tqdm

    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.data.regenerate import describe_plan, regenerate
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path

    params = make_sampling(**sampling)
    train_prompts, _ = split_prompts(load_prompts(prompts), holdout, params.seed, num_prompts)
    loaded = load_target(resolve_target_path(target_spec))
    taps = tap_layers(loaded, num_layers, target_layers)
    budget = cache_budget_mb << 20
    click.echo(describe_plan(loaded, train_prompts, params, len(taps), budget))
    with tqdm(total=len(train_prompts), desc="generate", unit="prompt") as bar:
        def progress(done, total, tokens):
            bar.update(done - bar.n)
            bar.set_postfix(tokens=tokens)

        store = regenerate(loaded, train_prompts, params, out_dir, tap_layer_ids=taps, cache_budget_bytes=budget,
                           batch_size=batch_size, on_progress=progress)
    click.echo(json.dumps(store.summary()))


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name (smollm2-135m).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), required=True, help="From `draftsmith generate`.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Run directory.")
@click.option("--variant", type=click.Choice(["dflash2", "dflash"]), default="dflash2", show_default=True)
@click.option("--num-layers", default=2, show_default=True)
@click.option("--block-size", default=8, show_default=True)
@click.option("--mask-token-id", default=None, type=int, help="Default: chosen by the stated rule.")
@click.option("--steps", default=train_default("steps"), show_default=True)
@click.option("--max-minutes", default=None, type=float, help="Stop (with a checkpoint) after this long.")
@click.option("--batch-size", default=train_default("batch_size"), show_default=True,
              help="Sequences per micro-batch per process.")
@click.option("--grad-accum", default=train_default("grad_accum"), show_default=True)
@click.option("--anchors", "anchors_per_sequence", default=train_default("anchors_per_sequence"), show_default=True,
              help="Blocks per sequence.")
@click.option("--lr", default=train_default("lr"), show_default=True)
@click.option("--warmup-steps", default=train_default("warmup_steps"), show_default=True)
@click.option("--zero-stage", type=click.Choice(["2", "3"]), default="2", show_default=True)
@click.option("--checkpoint-every", default=train_default("checkpoint_every"), show_default=True)
@click.option("--init", type=click.Choice(["target", "random"]), default=train_default("init"), show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--nproc", default=1, show_default=True, help="Processes (CPU: gloo; GPU: one per device).")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --out.")
@user_errors
def train(target_spec, data_dir, out_dir, variant, num_layers, block_size, mask_token_id, nproc, resume,
          zero_stage, **settings) -> None:
    """Distil a drafter from regenerated data under DeepSpeed; writes OUT/drafter (reference format)."""
    import os

    if nproc > 1 and "RANK" not in os.environ:
        relaunch_distributed(nproc)
        return
    from trainer.data.store import DataStore
    from trainer.drafter.config import DrafterConfig
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path
    from trainer.targets.chat import choose_mask_token_id
    from trainer.training.config import TrainConfig
    from trainer.training.loop import Trainer

    cfg = TrainConfig(zero_stage=int(zero_stage), **settings)
    loaded = load_target(resolve_target_path(target_spec))
    store = DataStore.open(data_dir)
    if mask_token_id is None:
        mask_token_id, _ = choose_mask_token_id(loaded.tokenizer, loaded.vocab_size)
    drafter_config = DrafterConfig.for_target(loaded, variant=variant, num_layers=num_layers, block_size=block_size,
                                              mask_token_id=mask_token_id, target_layer_ids=store.meta["tap_layer_ids"])
    drafter_dir = Trainer(loaded, store, out_dir, drafter_config, cfg, [progress_printer(cfg)]).run(resume=resume)
    if int(os.environ.get("RANK", 0)) == 0:
        click.echo(f"drafter written to {drafter_dir}")


def progress_printer(cfg):
    """A step callback that drives a tqdm bar and prints a line every cfg.log_every steps."""
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, desc="train", unit="step")

    def on_step(record: dict) -> None:
        bar.update(record["step"] - bar.n)
        bar.set_postfix(loss=record["loss"], tau=record["train_tau_estimate"], tok_s=record["tokens_per_s"])
        if record["step"] % cfg.log_every == 0 or record["step"] == cfg.steps:
            bar.write(json.dumps({k: record[k] for k in ("step", "loss", "train_tau_estimate", "lr", "tokens_per_s")}))

    return on_step


def relaunch_distributed(nproc: int) -> None:
    """Run this same command under torchrun with nproc processes (each sees RANK and runs directly)."""
    import subprocess

    from trainer.training.distributed import _free_port

    args = sys.argv[1:]
    # Drop our --nproc: torchrun's parser would take it for an abbreviation of its --nproc-per-node.
    for index, arg in enumerate(args):
        if arg == "--nproc":
            args = args[:index] + args[index + 2:]
            break
        if arg.startswith("--nproc="):
            args = args[:index] + args[index + 1:]
            break
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               f"--master-port={_free_port()}", "-m", "draftsmith.cli", *args]
    sys.exit(subprocess.call(command))


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name.")
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), required=True)
@click.option("--out", "out_file", type=click.Path(path_type=Path), required=True, help="report.json to write.")
@click.option("--prompts", default="builtin", show_default=True)
@click.option("--holdout", default=0.1, show_default=True, help="Validation uses the held-out share.")
@click.option("--num-prompts", default=VALIDATION_PROMPTS, show_default=True, help="Validation prompts.")
@click.option("--validation-max-new-tokens", default=VALIDATION_MAX_NEW_TOKENS, show_default=True)
@click.option("--sampling-draws", default=SAMPLING_DRAWS, show_default=True, help="Draws of the sampling test.")
@sampling_options
@user_errors
def validate(target_spec, drafter_dir, out_file, prompts, holdout, num_prompts, validation_max_new_tokens,
             sampling_draws, **sampling) -> None:
    """Prove a drafter lossless on held-out prompts and measure tau and speedup; writes report.json."""
    from tqdm import tqdm

    from trainer.data.prompts import load_prompts, split_prompts
    from trainer.atomic import atomic_write_json
    from trainer.drafter.checkpoint import load_drafter
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path
    from trainer.validation.report import require_passed
    from trainer.validation.report import validate as run_validation

    params = make_sampling(**sampling)
    _, holdout_prompts = split_prompts(load_prompts(prompts), holdout, params.seed)
    loaded = load_target(resolve_target_path(target_spec))
    drafter = load_drafter(drafter_dir, loaded.device, loaded.dtype)
    with tqdm(total=min(num_prompts, len(holdout_prompts)), desc="validate", unit="prompt") as bar:
        report = run_validation(loaded, drafter, holdout_prompts[:num_prompts], params,
                                max_new_tokens=validation_max_new_tokens, sampling_draws=sampling_draws,
                                on_progress=lambda done, total: bar.update(done - bar.n))
    atomic_write_json(out_file, report)
    click.echo(json.dumps({k: report[k] for k in ("passed", "tau", "oracle_tau", "recommended_block_size")}
                          | {"speedup": report["speedup"]["ratio"]}))
    require_passed(report)


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name.")
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), required=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Artifact directory.")
@click.option("--report", "report_file", type=click.Path(path_type=Path), default=None)
@click.option("--metrics", "metrics_file", type=click.Path(path_type=Path), default=None)
@user_errors
def export(target_spec, drafter_dir, out_dir, report_file, metrics_file) -> None:
    """Package a drafter: reference safetensors, GGUF f16 + q8_0, model card, manifest."""
    from trainer.errors import DraftsmithError
    from trainer.export.artifacts import export_artifacts
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path

    target_path = resolve_target_path(target_spec)
    if not target_path.is_dir():
        raise DraftsmithError(f"the target directory {target_path} is missing; export needs the drafter's target "
                              "(its tokenizer goes into the GGUF, and the drafter is checked against it)")
    report = json.loads(report_file.read_text()) if report_file else None
    manifest = export_artifacts(drafter_dir, load_target(target_path), out_dir, report=report,
                                metrics_file=metrics_file, target_name=target_spec)
    click.echo(f"{len(manifest['files'])} files written to {out_dir}")


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name (smollm2-135m).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out, skipping finished stages.")
@click.option("--prompts", default="builtin", show_default=True)
@click.option("--num-prompts", default=None, type=int, help="Training prompts to regenerate (default: the whole training split).")
@click.option("--holdout", default=0.1, show_default=True)
@click.option("--variant", type=click.Choice(["dflash2", "dflash"]), default="dflash2", show_default=True)
@click.option("--num-layers", default=2, show_default=True)
@click.option("--block-size", default=8, show_default=True)
@click.option("--mask-token-id", default=None, type=int)
@click.option("--steps", default=train_default("steps", main_job=True), show_default=True)
@click.option("--train-minutes", default=train_default("max_minutes", main_job=True), show_default=True,
              help="Training time limit (stops with a checkpoint).")
@click.option("--batch-size", default=train_default("batch_size"), show_default=True)
@click.option("--anchors", "anchors_per_sequence", default=train_default("anchors_per_sequence"), show_default=True)
@click.option("--lr", default=train_default("lr"), show_default=True)
@click.option("--init", type=click.Choice(["target", "random"]), default=train_default("init"), show_default=True)
@click.option("--generation-batch-size", default=32, show_default=True)
@click.option("--validation-prompts", default=VALIDATION_PROMPTS, show_default=True)
@click.option("--validation-max-new-tokens", default=VALIDATION_MAX_NEW_TOKENS, show_default=True)
@sampling_options
@user_errors
def run(target_spec, out_dir, resume, prompts, num_prompts, holdout, variant, num_layers, block_size, mask_token_id,
        steps, train_minutes, batch_size, anchors_per_sequence, lr, init, generation_batch_size,
        validation_prompts, validation_max_new_tokens, **sampling) -> None:
    """Train, prove and package a drafter end to end: prepare, generate, train, validate, export."""
    from trainer.pipeline import Run, RunConfig
    from trainer.run_progress import RunProgress
    from trainer.training.config import TrainConfig

    config = RunConfig(
        target=target_spec, sampling=make_sampling(**sampling), prompts=prompts, num_prompts=num_prompts,
        holdout=holdout, variant=variant, num_layers=num_layers, block_size=block_size, mask_token_id=mask_token_id,
        train=TrainConfig(steps=steps, max_minutes=train_minutes, batch_size=batch_size,
                          anchors_per_sequence=anchors_per_sequence, lr=lr, init=init, seed=sampling["seed"]),
        generation_batch_size=generation_batch_size, validation_prompts=validation_prompts,
        validation_max_new_tokens=validation_max_new_tokens,
    )
    with RunProgress() as progress:
        state = Run(config, out_dir, progress).execute(resume=resume)
    report = json.loads((Path(out_dir) / "report.json").read_text())
    click.echo(json.dumps({
        "out": str(out_dir), "minutes": round(sum(s["seconds"] for s in state["stages"].values()) / 60, 1),
        "tau": report["tau"], "greedy_mismatches": report["lossless"]["greedy"]["mismatches"],
        "sampling_p_value": round(report["lossless"]["sampling"]["p_value"], 4),
        "speedup": report["speedup"]["ratio"], "recommended_block_size": report["recommended_block_size"],
    }, indent=2))
