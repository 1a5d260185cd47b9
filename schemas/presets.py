"""Recipe presets: the CPU main job, or the published DFlash recipe scaled for GPUs.

A preset is a table of JobSpec fields under dotted names (`training.max_steps`, the shape of the `flags` dict in
trainer/cli_run.py), laid *under* what the user gives: a spec file's fields and command-line flags win
(`lay_under`). One function picks it, from the hardware and the target:

    choose_preset("auto" | "cpu" | "gpu", gpu_count=..., target_parameters_billion=..., budget_minutes=...)

`auto` is `gpu` when a GPU is visible (gpu_count > 0), else `cpu`. The `cpu` preset is today's recipe constant
for constant (schemas/recipe.py), so a spec laid over it is the JobSpec it was without a preset. The `gpu` preset
is SpecForge's DFlash recipe (DESIGN.md §6): 5 layers, block 16 (decay gamma 7 from the block size), 512 anchors
per sequence, AdamW lr 6e-4 with a warm-up of 4 % of the steps then a cosine, grad-clip 1.0 (the trainer's),
6 epochs over the regenerated samples, 512-token generations. With `budget_minutes` it is scaled to the budget:
the prompts regeneration can afford in GPU_GENERATE_SHARE of it, 6 epochs of them, and training capped at
GPU_TRAIN_SHARE of it (training's schedule then finishes its decay on time: trainer/training/schedule.py).

Knobs the JobSpec lacked: the warm-up share is a JobSpec field (`training.warmup_share`, None = the trainer's
fixed 30 warm-up steps, dropped from canonical_json when None) because a preset is JobSpec fields that the API,
the worker and `draftsmith run` must read alike; epochs are not a field: one regenerated sample per training
prompt, so 6 epochs is `training.max_steps` computed here from `data.count`; the generation length already is one
(`sampling.max_new_tokens`). The generation batch is how a machine runs the job, not what the job is: it stays a
`draftsmith run` option (`Preset.generation_batch_size`).

Pure (no torch): the estimate prices a preset with `preset_fields` without the ML stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from schemas import recipe
from schemas.prompts import BUILTIN_PROMPT_COUNT, MAX_PROMPTS_PER_JOB

PresetName = Literal["auto", "cpu", "gpu"]
PRESETS: tuple[str, ...] = get_args(PresetName)

CPU_FIELDS: dict[str, object] = {
    "drafter.variant": recipe.VARIANT,
    "drafter.num_layers": recipe.NUM_LAYERS,
    "drafter.block_size": recipe.BLOCK_SIZE,
    "sampling.max_new_tokens": recipe.MAX_NEW_TOKENS,
    "training.max_steps": recipe.TRAIN_STEPS,
    "training.max_minutes": recipe.TRAIN_MAX_MINUTES,
    "training.learning_rate": recipe.LEARNING_RATE,
    "training.batch_size": recipe.BATCH_SIZE,
    "training.anchors_per_sequence": recipe.ANCHORS_PER_SEQUENCE,
    "validation.prompts": recipe.VALIDATION_PROMPTS,
    "validation.max_new_tokens": recipe.VALIDATION_MAX_NEW_TOKENS,
    "validation.sampling_draws": recipe.SAMPLING_DRAWS,
}
"""Today's CPU main job, field for field: every value is the JobSpec's own default. data.count is left unset (its
default depends on the source: recipe.BUILTIN_PROMPTS of the built-in set, every prompt of a file)."""
CPU_GENERATION_BATCH_SIZE = 32


@dataclass(frozen=True)
class Preset:
    name: Literal["cpu", "gpu"]
    fields: dict[str, object]
    """JobSpec fields by dotted name; a None value sets the field to null (e.g. no training time cap)."""
    generation_batch_size: int
    """Prompts regenerated side by side (`draftsmith run --generation-batch-size`)."""
    notes: list[str] = field(default_factory=list)
    """How the fields were sized, for a person (printed by `draftsmith run`, returned with an estimate)."""


def generate_tokens_per_s(target_parameters_billion: float, gpu_count: int) -> float:
    """Planned regeneration tokens/s (schemas/recipe.py's planning figures)."""
    per_gpu = min(recipe.GPU_GENERATE_TOKENS_PER_S_MAX,
                  recipe.GPU_GENERATE_TOKENS_PER_S_1B / max(target_parameters_billion, 1e-3))
    return per_gpu * max(gpu_count, 1)


def resolve_preset_name(requested: str, gpu_count: int) -> Literal["cpu", "gpu"]:
    if requested not in PRESETS:
        raise ValueError(f"preset {requested!r} is not one of {', '.join(PRESETS)}")
    if requested == "auto":
        return "gpu" if gpu_count > 0 else "cpu"
    return requested  # type: ignore[return-value]


def choose_preset(requested: str = "auto", *, gpu_count: int, target_parameters_billion: float | None = None,
                  budget_minutes: float | None = None, source_prompts: int | None = None,
                  holdout_share: float = recipe.HOLDOUT_SHARE, warm_start: bool = False) -> Preset:
    """The preset for `requested` on a machine with `gpu_count` GPUs the job trains on (module docstring).

    `target_parameters_billion`: the target's size (None: recipe.GPU_ASSUMED_TARGET_B); `budget_minutes`: the
    whole job's wall-clock budget (None: the recipe unscaled, no time cap); `source_prompts`: prompts the job's
    source holds (None: the built-in set's 640). Only the gpu preset reads them; a gpu preset on a machine with
    no GPU (gpu_count 0) is planned as one device. `warm_start`: the job starts from a parent drafter, and trains
    for a share of the preset's budget (`specialisation_budget`)."""
    preset = _from_scratch_preset(requested, gpu_count=gpu_count, target_parameters_billion=target_parameters_billion,
                                  budget_minutes=budget_minutes, source_prompts=source_prompts,
                                  holdout_share=holdout_share)
    if not warm_start:
        return preset
    budget = specialisation_budget(preset.fields)
    note = (f"warm start: {recipe.WARM_START_BUDGET_SHARE:g} of the preset's training budget, "
            f"{budget['training.max_steps']} steps" + ("" if budget["training.max_minutes"] is None else
                                                        f", at most {budget['training.max_minutes']:g} min"))
    return Preset(preset.name, {**preset.fields, **budget}, preset.generation_batch_size, [*preset.notes, note])


def _from_scratch_preset(requested: str, *, gpu_count: int, target_parameters_billion: float | None,
                         budget_minutes: float | None, source_prompts: int | None, holdout_share: float) -> Preset:
    name = resolve_preset_name(requested, gpu_count)
    if name == "cpu":
        return Preset("cpu", dict(CPU_FIELDS), CPU_GENERATION_BATCH_SIZE,
                      ["cpu preset: the main job's recipe (schemas/recipe.py), unchanged"])
    if budget_minutes is not None and not budget_minutes > 0:
        raise ValueError(f"budget_minutes must be positive, got {budget_minutes!r}")
    size = target_parameters_billion or recipe.GPU_ASSUMED_TARGET_B
    devices = max(gpu_count, 1)
    available = min(source_prompts or BUILTIN_PROMPT_COUNT, MAX_PROMPTS_PER_JOB)
    notes = [f"gpu preset: SpecForge's DFlash recipe ({recipe.GPU_NUM_LAYERS} layers, block {recipe.GPU_BLOCK_SIZE}, "
             f"{recipe.GPU_ANCHORS_PER_SEQUENCE} anchors, lr {recipe.GPU_LEARNING_RATE:g}, warm-up "
             f"{recipe.GPU_WARMUP_SHARE:g} of the steps, {recipe.GPU_EPOCHS} epochs) for a {size:g}B target on "
             f"{devices} GPU(s)"]
    if budget_minutes is None:
        prompts, train_minutes = available, None
        notes.append(f"no budget: all {prompts} prompts of the source, no training time cap")
    else:
        rate = generate_tokens_per_s(size, devices)
        affordable = int(recipe.GPU_GENERATE_SHARE * budget_minutes * 60 * rate / recipe.GPU_MAX_NEW_TOKENS)
        prompts = min(available, max(recipe.GPU_MIN_PROMPTS, affordable))
        train_minutes = round(recipe.GPU_TRAIN_SHARE * budget_minutes, 3)
        notes.append(f"budget {budget_minutes:g} min: {prompts} prompts (regeneration planned at {rate:,.0f} "
                     f"tokens/s for {recipe.GPU_GENERATE_SHARE:g} of it, at most {available} in the source), "
                     f"training capped at {train_minutes:g} min")
    train_prompts = max(1, prompts - int(prompts * holdout_share))
    steps = max(1, math.ceil(recipe.GPU_EPOCHS * train_prompts / (recipe.GPU_BATCH_SIZE * devices)))
    notes.append(f"{steps} steps = {recipe.GPU_EPOCHS} epochs x {train_prompts} training samples / "
                 f"({recipe.GPU_BATCH_SIZE} x {devices} sequences a step)")
    fields: dict[str, object] = {
        "drafter.num_layers": recipe.GPU_NUM_LAYERS,
        "drafter.block_size": recipe.GPU_BLOCK_SIZE,
        "data.count": prompts,
        "sampling.max_new_tokens": recipe.GPU_MAX_NEW_TOKENS,
        "training.max_steps": steps,
        "training.max_minutes": train_minutes,
        "training.learning_rate": recipe.GPU_LEARNING_RATE,
        "training.warmup_share": recipe.GPU_WARMUP_SHARE,
        "training.batch_size": recipe.GPU_BATCH_SIZE,
        "training.anchors_per_sequence": recipe.GPU_ANCHORS_PER_SEQUENCE,
        "validation.prompts": recipe.GPU_VALIDATION_PROMPTS,
    }
    return Preset("gpu", fields, recipe.GPU_GENERATION_BATCH_SIZE, notes)


def specialisation_budget(fields: dict[str, object] | None = None) -> dict[str, object]:
    """A warm start's training budget (dotted JobSpec fields) from a from-scratch job's `fields` (a preset's; None
    or missing: the recipe's): recipe.WARM_START_BUDGET_SHARE of its steps and of its time cap, and its warm-up as
    the same share of the (fewer) steps, so the schedule keeps its shape on a shorter run."""
    fields = fields or {}
    steps = fields.get("training.max_steps", recipe.TRAIN_STEPS)
    minutes = fields.get("training.max_minutes", recipe.TRAIN_MAX_MINUTES)
    warmup = fields.get("training.warmup_share")
    assert isinstance(steps, int) and (minutes is None or isinstance(minutes, int | float))
    share = recipe.WARM_START_BUDGET_SHARE
    return {
        "training.max_steps": max(1, math.ceil(steps * share)),
        "training.max_minutes": None if minutes is None else round(float(minutes) * share, 3),
        "training.warmup_share": warmup if warmup is not None else min(0.5, recipe.WARMUP_STEPS / steps),
    }


def preset_fields(name: str, *, gpu_count: int = 1, target_parameters_billion: float | None = None,
                  budget_minutes: float | None = None, source_prompts: int | None = None) -> dict[str, object]:
    """The JobSpec fields of preset `name` (`cpu` or `gpu`; `auto` with gpu_count), for a caller that prices
    or shows a preset without running it (the estimate). Lay them under a body with `lay_under`."""
    return choose_preset(name, gpu_count=gpu_count, target_parameters_billion=target_parameters_billion,
                         budget_minutes=budget_minutes, source_prompts=source_prompts).fields


def lay_under(body: dict[str, Any], fields: dict[str, object]) -> dict[str, Any]:
    """`body` (a JobSpec body: the spec file with the flags given laid over it) with every preset field it does not
    set filled in. A new dict; `body`'s own values, null included, always win."""
    merged = {section: dict(value) if isinstance(value, dict) else value for section, value in body.items()}
    for dotted, value in fields.items():
        section, name = dotted.split(".")
        merged.setdefault(section, {}).setdefault(name, value)
    return merged
