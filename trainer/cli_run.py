"""`draftsmith run`: the service's job, run locally. Its flags (or `--spec job.json`, the very body `POST /v1/jobs`
takes) become a JobSpec, and the JobSpec becomes the trainer's RunConfig through trainer/job_config.py, the
same mapping the worker uses: the same inputs train the same drafter here and on the service."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from schemas import recipe
from schemas.bounds import file_uri_path
from schemas.job_folder import EXPORTED_REPORT
from schemas.presets import PRESETS, Preset, choose_preset, lay_under
from schemas.prompts import BUILTIN_PROMPT_COUNT
from schemas.validation_report import Speedup, ValidationReport
from trainer.cli import device_options, parse_layers, sampling_options, train_default, user_errors
from trainer.errors import DraftsmithError


def job_body(spec_file: Path | None, target: str | None, prompts: str | None, flags: dict,
             base: str | None = None) -> dict:
    """The JobSpec body: `--spec`'s JSON (if any) with every flag given on the command line laid over it."""
    body = json.loads(spec_file.read_text()) if spec_file else {}
    if not isinstance(body, dict):
        raise DraftsmithError(f"{spec_file} must hold a JSON object, the body of POST /v1/jobs")
    if target is not None:
        body["target"] = {**body.get("target", {}), "uri": target_uri(target)}
    if base is not None:
        body.setdefault("target", {})["base"] = target_uri(base)
    if prompts is not None:
        body.setdefault("data", {})["source"] = "builtin" if prompts == "builtin" else Path(prompts).resolve().as_uri()
    for dotted, value in flags.items():
        if value is not None:
            section, name = dotted.split(".")
            body.setdefault(section, {})[name] = value
    if "target" not in body:
        raise DraftsmithError("give --target (a directory or a bundled name such as smollm2-135m) or --spec")
    return body


def target_uri(target: str) -> str:
    """A CLI target (a bundled name, a directory or a URI) as the URI a JobSpec takes."""
    from schemas.job_spec import BUNDLED_TARGETS

    if target in BUNDLED_TARGETS:
        return f"bundled:{target}"
    if target.startswith(("bundled:", "file://", "hf://", "s3://")):
        return target
    return Path(target).resolve().as_uri()


def local_adapter_base(target: str) -> str | None:
    """On one's own machine, the base an adapter folder's config names, when that folder is here: a convenience of
    `draftsmith run`, said aloud. The service never reads it (trainer/targets/adapters.py)."""
    from trainer.targets.adapters import suggested_base

    if target.startswith(("bundled:", "hf://", "s3://")):
        return None
    folder = file_uri_path(target) if target.startswith("file://") else target
    base = suggested_base(folder) if Path(folder).is_dir() else None
    if base is not None:
        click.echo(f"base model: {base} (named by the adapter's adapter_config.json; --base chooses another)", err=True)
    return base


def local_path(uri: str, what: str) -> str:
    """What the trainer opens for a spec URI: a bundled name or a local path. Remote sources are the service's."""
    if uri == "builtin" or uri.startswith("bundled:"):
        return uri.removeprefix("bundled:")
    if uri.startswith("file://"):
        return file_uri_path(uri)
    raise DraftsmithError(f"`draftsmith run` reads a local {what}; {uri!r} needs the service, which fetches hf://, "
                          "s3:// and uploaded files: use `draftsmith submit` against a server (`draftsmith serve`)")


def given_sampling(base: dict, options: dict) -> dict:
    """The spec's sampling with the sampling flags typed on the command line laid over it (their defaults are
    the spec's own, so an untyped flag changes nothing)."""
    from click.core import ParameterSource

    context = click.get_current_context()
    typed = {name: value for name, value in options.items()
             if context.get_parameter_source(name) is ParameterSource.COMMANDLINE}
    sampling = dict(base)
    chat_template = dict(sampling.get("chat_template", {}))
    for name in ("enable_thinking", "system_prompt"):
        if name in typed:
            chat_template[name] = typed.pop(name)
    if chat_template:
        sampling["chat_template"] = chat_template
    return {**sampling, **typed}


def run_preset(requested: str, body: dict, *, nproc: int, budget_minutes: float | None) -> Preset:
    """The preset `draftsmith run --preset` lays under `body`: `auto` is gpu when the job may run on a visible GPU
    (not when it asks for the CPU); a gpu preset is sized for the GPUs training uses (--nproc of the visible
    ones), the target's size and the budget; a warm start (the spec's `init`) for a share of its training budget.
    Its notes go to stderr."""
    from schemas.compute import device_kind

    visible = 0
    if requested != "cpu" and device_kind(body.get("compute", {}).get("device", "auto"))[0] != "cpu":
        import torch

        visible = torch.cuda.device_count()
    source = body.get("data", {}).get("source", "builtin")
    try:
        chosen = choose_preset(requested, gpu_count=min(visible, max(nproc, 1)),
                               target_parameters_billion=target_parameters_billion(body["target"]["uri"]),
                               budget_minutes=budget_minutes,
                               source_prompts=BUILTIN_PROMPT_COUNT if source == "builtin" else None,
                               holdout_share=body.get("data", {}).get("holdout_share", recipe.HOLDOUT_SHARE),
                               warm_start=body.get("init") is not None)
    except ValueError as error:
        raise DraftsmithError(str(error)) from None
    if requested != "cpu":
        for note in chosen.notes:
            click.echo(note, err=True)
    return chosen


def target_parameters_billion(uri: str) -> float | None:
    """The target's size in billions of parameters that a decode step runs through (what sizes the gpu preset's
    time plan), as far as its folder tells without loading it (a bundled target's known size, a local directory's
    safetensors headers, else its config.json); None when unknown."""
    if uri.startswith("bundled:"):
        from schemas.job_spec import BUNDLED_PARAMETERS_BILLION

        return BUNDLED_PARAMETERS_BILLION.get(uri.removeprefix("bundled:"))
    if not uri.startswith("file://"):
        return None
    try:
        folder = Path(file_uri_path(uri))
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if list(folder.glob("*.safetensors")):  # exact, from the headers; a mixture of experts at its active share
        from trainer.targets.placement import active_parameters

        return active_parameters(folder, config) / 1e9
    config = config.get("text_config", config)
    try:
        hidden, layers, inner = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or hidden // heads
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
        embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
        return (layers * (attention + 3 * hidden * inner) + embeddings) / 1e9
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def with_drafter_adapter(body: dict, rank: int | None) -> dict:
    """`--drafter-adapter-rank N` laid over the spec's training.drafter_adapter (its alpha, if any, kept). An adapter
    is trained over a parent: refused here, naming the flag, when neither --from-drafter nor the spec gives one."""
    if rank is None:
        return body
    if body.get("init") is None:
        raise DraftsmithError("--drafter-adapter-rank trains a LoRA over a parent drafter: give the parent with "
                              "--from-drafter DIR (or init.from_drafter in --spec), or drop --drafter-adapter-rank to "
                              "train every weight")
    training = body.setdefault("training", {})
    training["drafter_adapter"] = {**(training.get("drafter_adapter") or {}), "rank": rank}
    return body


def parse_spec(body: dict):
    from pydantic import ValidationError

    from schemas.job_spec import JobSpec

    try:  # a local user may name any directory of their own
        return JobSpec.model_validate(body, context={"allowed_file_roots": ["/"]})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "spec"
        raise DraftsmithError(f"{field}: {error['msg']}") from None


@click.command()
@click.option("--target", "target_spec", default=None, help="Target directory, bundled name (smollm2-135m) or URI.")
@click.option("--base", "base_spec", default=None,
              help="For a --target that is a LoRA adapter folder: its base model (directory, bundled name or URI); "
                   "default here: the adapter's base_model_name_or_path when that is a directory on this machine "
                   "(the service always needs target.base).")
@click.option("--from-drafter", "parent_spec", default=None,
              help="Start from this parent drafter (a folder or file:// URI) instead of from nothing: ours, the z-lab "
                   "reference format, vLLM speculators', SpecForge's or a DSpark drafter's backbone, recognised by "
                   "its files; a DFlash parent is upgraded to DFlash 2. Sets init.from_drafter.")
@click.option("--drafter-adapter-rank", "adapter_rank", type=int, default=None,
              help="Preview, with --from-drafter only: train a LoRA of this rank over the parent's layers and projection "
                   "instead of every weight; drafter-adapter/ (PEFT) ships beside the merged drafter, which is served. "
                   f"Sets training.drafter_adapter (alpha: {recipe.DRAFTER_ADAPTER_ALPHA_PER_RANK:g} x rank unless the "
                   "spec gives one).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@click.option("--spec", "spec_file", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="A job spec (the JSON body of POST /v1/jobs); flags given here override its fields.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out, skipping finished stages.")
@click.option("--prompts", default=None, help="builtin (default) or a .jsonl/.parquet prompts file.")
@click.option("--num-prompts", type=int, default=None, help="Prompts drawn from the source, hold-out included (default all; "
              f"{recipe.BUILTIN_PROMPTS} of the built-in set).")
@click.option("--holdout", type=float, default=None, help=f"Hold-out share (default {recipe.HOLDOUT_SHARE}).")
@click.option("--variant", type=click.Choice(["dflash2", "dflash"]), default=None, help=f"Default {recipe.VARIANT}.")
@click.option("--num-layers", type=int, default=None, help=f"Drafter layers (default {recipe.NUM_LAYERS}).")
@click.option("--block-size", type=int, default=None, help=f"Default {recipe.BLOCK_SIZE}.")
@click.option("--target-layers", default=None, help="Comma-separated target layer ids to tap (default: the rule).")
@click.option("--mask-token-id", type=int, default=None)
@click.option("--steps", type=int, default=None, help=f"Training steps (default {recipe.TRAIN_STEPS}).")
@click.option("--train-minutes", type=float, default=None,
              help="Training time budget: the learning-rate schedule is planned for it, so a slow machine trains fewer "
                   f"steps to a finished decay (default {recipe.TRAIN_MAX_MINUTES}).")
@click.option("--batch-size", type=int, default=None, help=f"Default {recipe.BATCH_SIZE}.")
@click.option("--anchors", "anchors_per_sequence", type=int, default=None,
              help=f"Default {recipe.ANCHORS_PER_SEQUENCE}.")
@click.option("--lr", type=float, default=None, help=f"Default {recipe.LEARNING_RATE}.")
@click.option("--zero-stage", type=click.Choice(["2", "3"]), default=None, help=f"Default {recipe.ZERO_STAGE}.")
@click.option("--position-weighting", type=click.Choice(recipe.POSITION_WEIGHTINGS), default=None,
              help=f"How block positions weigh in the loss (default {recipe.POSITION_WEIGHTING}): dpace = D-PACE.")
@click.option("--dpace-alpha", type=float, default=None, help=f"D-PACE's smoothing (default {recipe.DPACE_ALPHA}).")
@click.option("--acceptance-loss-weight", type=float, default=None,
              help=f"Expected-acceptance term's weight (default {recipe.ACCEPTANCE_LOSS_WEIGHT}: off).")
@click.option("--allow-pickle", is_flag=True, default=None, help="Accept pickle (*.bin) target weights.")
@click.option("--init", type=click.Choice(["target", "random"]), default=train_default("init"), show_default=True)
@click.option("--nproc", default=1, show_default=True, help="Training processes (CPU: gloo; GPU: one per device).")
@click.option("--generation-batch-size", type=int, default=None,
              help="Prompts regenerated side by side (default: the preset's, 32 on cpu, "
                   f"{recipe.GPU_GENERATION_BATCH_SIZE} on gpu).")
@click.option("--preset", type=click.Choice(PRESETS), default="cpu", show_default=True,
              help="Recipe laid under the spec and the flags (they win): cpu = the main job's recipe; gpu = the "
                   "published DFlash recipe (5 layers, block 16, 512 anchors, lr 6e-4, 6 epochs), sized by "
                   "--budget-minutes; auto = gpu when a GPU is visible (docs/DEVICES.md).")
@click.option("--budget-minutes", type=float, default=None,
              help="Wall-clock budget the gpu preset is sized to (prompts, steps, training time cap); default none.")
@click.option("--validation-prompts", type=int, default=None, help=f"Default {recipe.VALIDATION_PROMPTS}.")
@click.option("--validation-max-new-tokens", type=int, default=None,
              help=f"Default {recipe.VALIDATION_MAX_NEW_TOKENS}.")
@click.option("--sampling-draws", type=int, default=None, help=f"Default {recipe.SAMPLING_DRAWS}.")
@sampling_options
@device_options(default=None)
@user_errors
def run(target_spec, base_spec, parent_spec, adapter_rank, out_dir, spec_file, resume, prompts, num_prompts, holdout, variant, num_layers, block_size,
        target_layers, mask_token_id, steps, train_minutes, batch_size, anchors_per_sequence, lr, zero_stage,
        position_weighting, dpace_alpha, acceptance_loss_weight, allow_pickle, init, nproc, generation_batch_size, preset, budget_minutes, validation_prompts,
        validation_max_new_tokens, sampling_draws, device, dtype, **sampling) -> None:
    """Train, prove and package a drafter end to end: prepare, generate, train, validate, export."""
    from trainer.job_config import run_config_from_spec
    from trainer.pipeline import Launch, Run
    from trainer.run_progress import RunProgress

    layers = parse_layers(target_layers)
    flags = {
        "data.count": num_prompts, "data.holdout_share": holdout, "drafter.variant": variant,
        "drafter.num_layers": num_layers, "drafter.block_size": block_size,
        "drafter.target_layer_ids": list(layers) if layers else None, "drafter.mask_token_id": mask_token_id,
        "training.max_steps": steps, "training.max_minutes": train_minutes, "training.batch_size": batch_size,
        "training.anchors_per_sequence": anchors_per_sequence, "training.learning_rate": lr,
        "training.zero_stage": int(zero_stage) if zero_stage else None, "target.allow_pickle": allow_pickle,
        "training.position_weighting": position_weighting, "training.dpace_alpha": dpace_alpha,
        "training.acceptance_loss_weight": acceptance_loss_weight,
        "validation.prompts": validation_prompts, "validation.max_new_tokens": validation_max_new_tokens,
        "validation.sampling_draws": sampling_draws, "compute.device": device, "compute.dtype": dtype,
    }
    if base_spec is None and target_spec is not None:
        base_spec = local_adapter_base(target_spec)
    body = job_body(spec_file, target_spec, prompts, flags, base=base_spec)
    if parent_spec is not None:
        body["init"] = {**body.get("init", {}), "from_drafter": target_uri(parent_spec)}
    body = with_drafter_adapter(body, adapter_rank)
    chosen = run_preset(preset, body, nproc=nproc, budget_minutes=budget_minutes)
    body = lay_under(body, chosen.fields)  # the spec file and the flags win
    body["sampling"] = given_sampling(body.get("sampling", {}), sampling)
    spec = parse_spec(body)
    config = run_config_from_spec(spec, target=local_path(spec.target.uri, "target"),
                                  prompts=local_path(spec.data.source, "prompts file"),
                                  base=local_path(spec.target.base, "base model") if spec.target.base else None)
    # Knobs of this machine's run rather than of the job (the service uses their defaults too).
    # (a warm start, `init.from_drafter` in --spec, is the job's own choice and keeps its init)
    config = dataclasses.replace(config, train=config.train.replace(init=config.train.init
                                                                    if config.train.parent_drafter else init),
                                 generation_batch_size=generation_batch_size or chosen.generation_batch_size)
    with RunProgress() as progress:
        state = Run(config, out_dir, progress, Launch(nproc=nproc)).execute(resume=resume)
    report = ValidationReport.load(Path(out_dir) / EXPORTED_REPORT.path)
    sampling, speed = report.sampling, report.speedup or Speedup()
    train = state["stages"]["train"]
    click.echo(json.dumps({
        "out": str(out_dir), "minutes": round(sum(s["seconds"] for s in state["stages"].values()) / 60, 1),
        "train_steps": train.get("steps"), "train_budget_minutes": train.get("budget_minutes"),
        "train_seconds_per_step": train.get("seconds_per_step"), "tau": report.tau,
        "greedy_mismatches": report.greedy.mismatches,
        "sampling_test": sampling.status or ("passed" if sampling.passed else "failed"),
        "sampling_p_value": None if sampling.p_value is None else round(sampling.p_value, 4),
        "speedup": speed.ratio, "speedup_ci95": speed.ratio_ci95,
        "recommended_block_size": report.recommended_block_size,
    }, indent=2))
    click.echo(f"report: {Path(out_dir) / 'report.html'}")  # the same figures as charts; opens from disk
    if report.warm_start is not None and report.warm_start.advice:  # which drafter to serve: this one or its parent
        from report.warm_start import advice_text

        click.echo(f"warm start: {advice_text(report.warm_start)}")
    if report.serving_advice is not None:  # last, so it is what a person reads: e.g. do not enable it here
        click.echo(report.serving_advice.summary)
