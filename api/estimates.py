"""Back-of-envelope time and cost of a job, before committing to it.

The model is deliberately simple and every assumption is returned with the estimate:
- generation and training are throughput-bound and scale as 1/P for a target of P billion
  parameters (decode is memory-bandwidth bound; the drafter's width follows the target's); for a mixture of
  experts P is the *active* parameters (what a token runs through), while memory counts all of them;
- the throughputs below are per GPU for a 1B-parameter target at the batch sizes the worker
  uses, measured (cpu-2core, see DESIGN.md §6) or extrapolated from public serving benchmarks;
- a target that does not fit in one GPU's memory (bf16 weights + 30 %) needs more GPUs;
- prices are typical on-demand list prices per GPU-hour.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from api.schemas import EstimateOut, GpuEstimate, PresetEstimate, TrainingMemoryEstimate
from schemas.bounds import plausible_target_parameters_billion
from schemas.job_spec import BUNDLED_PARAMETERS_BILLION, JobSpec
from schemas.presets import choose_preset
from schemas.prompts import BUILTIN_PROMPT_COUNT, prompts_to_draw
from schemas.train_memory import reference_shape, training_memory
from schemas.validation_plan import validation_tokens


@dataclass(frozen=True)
class GpuClass:
    name: str
    memory_gb: float
    price_per_hour_usd: float
    generate_tokens_per_s_1b: float  # target decode tokens/s per GPU, 1B-parameter target
    train_tokens_per_s_1b: float  # drafter block tokens/s per GPU, 1B-parameter target


GPU_CLASSES: dict[str, GpuClass] = {
    gpu.name: gpu
    for gpu in (
        # cpu-2core numbers are the measured SmolLM2-135M figures scaled to 1B (31 tok/s x 0.135).
        GpuClass("cpu-2core", 24, 0.10, 4.2, 7.2),
        GpuClass("l4-24gb", 24, 0.80, 1_500, 20_000),
        GpuClass("a10g-24gb", 24, 1.01, 1_800, 25_000),
        GpuClass("a100-80gb", 80, 1.79, 5_000, 80_000),
        GpuClass("h100-80gb", 80, 2.99, 9_000, 150_000),
        GpuClass("h200-141gb", 141, 3.79, 11_000, 180_000),
    )
}
DEFAULT_TARGET_PARAMS_B = 8.0
MULTI_GPU_EFFICIENCY = 0.85  # data parallel loses some throughput to communication
BATCH_ONE_SLOWDOWN = 7.0
"""Batch-1 decoding (validation's timed subset) against the batched rate: 31 vs 215 tokens/s for SmolLM2-135M on
cpu-2core (DESIGN.md §6); GPUs lose at least as much at batch 1."""
FIXED_OVERHEAD_MINUTES = 5.0  # resolve/verify target, export, publish
_PARAMS_IN_NAME_RE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*[bB](?![A-Za-z0-9])")
_ACTIVE_IN_NAME_RE = re.compile(r"(?<![A-Za-z0-9])[aA](\d+(?:\.\d+)?)[bB](?![A-Za-z0-9])")  # Qwen3-30B-A3B


def target_parameters(spec: JobSpec, override: float | None) -> tuple[float, str]:
    """Target size in billions, and how we know it."""
    if override is not None:
        return override, f"target size {override:g}B as given (target_parameters_billion)"
    scheme, _, name = spec.target.uri.partition(":")
    if scheme == "bundled" and name in BUNDLED_PARAMETERS_BILLION:
        size = BUNDLED_PARAMETERS_BILLION[name]
        return size, f"target size {size:g}B (bundled model)"
    match = _PARAMS_IN_NAME_RE.search(_without_active(spec.target.uri.rsplit("/", 1)[-1]))
    # A size the name states must be plausible: "0b" would divide by zero, "99999999b" overflow.
    if match and plausible_target_parameters_billion(size := float(match.group(1))):
        return size, f"target size {size:g}B read from the model name; pass target_parameters_billion if wrong"
    return DEFAULT_TARGET_PARAMS_B, (
        f"target size unknown, assumed {DEFAULT_TARGET_PARAMS_B:g}B; pass target_parameters_billion for a better estimate"
    )


def _without_active(name: str) -> str:
    return _ACTIVE_IN_NAME_RE.sub("", name)


def active_parameters(spec: JobSpec, total: float, override: float | None) -> tuple[float, str]:
    """Billions of parameters a token runs through (a mixture of experts' active share), and how we know it."""
    if override is not None:
        return min(override, total), f"active parameters {min(override, total):g}B as given"
    match = _ACTIVE_IN_NAME_RE.search(spec.target.uri.rsplit("/", 1)[-1])
    if match and plausible_target_parameters_billion(active := float(match.group(1))) and active <= total:
        return active, (f"a mixture of experts with {active:g}B active parameters (read from the model name): time "
                        "scales with those, memory with all of them")
    return total, ("every parameter counted as active (a dense model); for a mixture of experts pass "
                   "target_active_parameters_billion")


def source_size(spec: JobSpec, uploaded_prompts: int | None) -> tuple[int, str]:
    """Prompts the job draws, hold-out included, and how we know: an uploaded file's own count (data.count caps
    it), the built-in set's, or data.count for a source we cannot count before fetching it."""
    count = spec.data.count
    if uploaded_prompts is not None:
        prompts = min(count, uploaded_prompts) if count else uploaded_prompts
        return prompts, f"{prompts} prompts from the uploaded file {spec.data.source} ({uploaded_prompts} in it)"
    if spec.data.source == "builtin":
        prompts = min(prompts_to_draw(spec.data.source, count), BUILTIN_PROMPT_COUNT)
        return prompts, f"{prompts} prompts from the built-in set ({BUILTIN_PROMPT_COUNT} in it)"
    if count:
        return count, f"data.count = {count} prompts (at most; the source is counted when the job runs)"
    return BUILTIN_PROMPT_COUNT, (f"the source {spec.data.source} is counted only when the job runs; assumed "
                                  f"{BUILTIN_PROMPT_COUNT} prompts: give data.count for a better estimate")


def with_preset(spec: JobSpec, fields: dict[str, object]) -> tuple[JobSpec, dict[str, object]]:
    """`spec` with every preset field it leaves unset filled in (what `lay_under` does to a body), and the fields
    that were filled. By copy, not validation: the spec is already admitted and the preset's values are valid
    JobSpec values (tests/trainer/test_presets.py)."""
    sections: dict[str, dict[str, object]] = {}
    for dotted, value in fields.items():
        section, name = dotted.split(".")
        if name not in getattr(spec, section).model_fields_set:
            sections.setdefault(section, {})[name] = value
    update = {section: getattr(spec, section).model_copy(update=values) for section, values in sections.items()}
    applied = {f"{section}.{name}": value for section, values in sections.items() for name, value in values.items()}
    return spec.model_copy(update=update), applied


def _preset_estimates(spec: JobSpec, gpu_class: str | None, gpu_count: int, params_b: float, active_b: float,
                      uploaded_prompts: int | None) -> list[PresetEstimate]:
    """The job priced under each preset, laid under its own fields."""
    presets = []
    for name in ("cpu", "gpu"):
        # The preset plans time, so it is sized by the active parameters.
        preset = choose_preset(name, gpu_count=gpu_count, target_parameters_billion=active_b,
                               source_prompts=uploaded_prompts, warm_start=spec.init is not None)
        laid, applied = with_preset(spec, preset.fields)
        priced = estimate_job(laid, gpu_class=gpu_class, gpu_count=gpu_count, target_parameters_billion=params_b,
                              uploaded_prompts=uploaded_prompts, with_presets=False,
                              target_active_parameters_billion=active_b)
        presets.append(PresetEstimate(preset=name, fields=applied, prompts=priced.prompts,  # type: ignore[arg-type]
                                      tokens_to_generate=priced.tokens_to_generate,
                                      training_steps=priced.training_steps,
                                      drafter_tokens_per_step=priced.drafter_tokens_per_step,
                                      training_memory=priced.training_memory,
                                      estimates=priced.estimates, notes=preset.notes))
    return presets


def training_memory_estimate(spec: JobSpec, params_b: float, gpu_count: int) -> TrainingMemoryEstimate:
    """One training step's peak memory on each of `gpu_count` GPUs (schemas/train_memory.py)."""
    shape = reference_shape(params_b)
    taps = len(spec.drafter.target_layer_ids or []) or max(3, spec.drafter.num_layers)
    memory = training_memory(
        shape, target_parameters_billion=params_b, dtype_bytes=4 if spec.compute.dtype == "float32" else 2,
        num_layers=spec.drafter.num_layers, block_size=spec.drafter.block_size,
        anchors_per_sequence=spec.training.anchors_per_sequence, batch_size=spec.training.batch_size,
        max_new_tokens=spec.sampling.max_new_tokens, taps=taps, dflash2=spec.drafter.variant == "dflash2",
        gpu_count=gpu_count, zero_stage=spec.training.zero_stage)
    return TrainingMemoryEstimate(**vars(memory), attention_kernel="memory-efficient SDPA", gpu_count=gpu_count,
                                  assumed_shape=shape.name)


def _memory_note(memory: TrainingMemoryEstimate) -> str:
    return (f"training memory: {memory.peak_gb:g} GB on one GPU for a drafter shaped like {memory.assumed_shape}, "
            f"sequences of {memory.sequence_tokens} tokens; attention on the memory-efficient kernel takes "
            f"{memory.attention_gb:g} GB of it (the float32 math kernel would hold {memory.math_attention_gb:g} GB)")


def estimate_job(
    spec: JobSpec, *, gpu_class: str | None, gpu_count: int, target_parameters_billion: float | None,
    uploaded_prompts: int | None = None, with_presets: bool = True,
    target_active_parameters_billion: float | None = None,
) -> EstimateOut:
    params_b, size_note = target_parameters(spec, target_parameters_billion)
    active_b, active_note = active_parameters(spec, params_b, target_active_parameters_billion)
    prompts, prompts_note = source_size(spec, uploaded_prompts)
    holdout = int(prompts * spec.data.holdout_share)
    max_new = spec.sampling.max_new_tokens
    tokens_to_generate = prompts * max_new
    tokens_per_step = spec.training.batch_size * spec.training.anchors_per_sequence * spec.drafter.block_size
    # The drafter's cost grows with its depth; the throughput table is for the default 2 layers.
    layer_factor = spec.drafter.num_layers / 2
    classes = [GPU_CLASSES[gpu_class]] if gpu_class else list(GPU_CLASSES.values())
    estimates = []
    for gpu in classes:
        needed = max(1, math.ceil(params_b * 2 * 1.3 / gpu.memory_gb))
        count = max(gpu_count, needed)
        speedup = count * (MULTI_GPU_EFFICIENCY if count > 1 else 1.0)
        generate_rate = gpu.generate_tokens_per_s_1b / active_b * speedup
        train_rate = gpu.train_tokens_per_s_1b / active_b / layer_factor * speedup
        generation_min = tokens_to_generate / generate_rate / 60
        training_min = spec.training.max_steps * tokens_per_step / train_rate / 60
        limited_by = "max_steps"
        if spec.training.max_minutes is not None and training_min > spec.training.max_minutes:
            training_min, limited_by = spec.training.max_minutes, "max_minutes"
        # Validation's plan (schemas/validation_plan.py): batched references and sampling draws at the batched
        # rate, the timed subset at batch 1, BATCH_ONE_SLOWDOWN times slower.
        # On a GPU every validation prompt is checked speculatively, and a bfloat16 target's greedy reference is
        # a decode of its own (docs/DEVICES.md).
        decoded = validation_tokens(min(spec.validation.prompts, holdout), spec.validation.max_new_tokens,
                                    spec.validation.sampling_draws, every_prompt=True,
                                    shaped_reference=spec.compute.dtype != "float32")
        validation_tokens_at_batch_rate = decoded.batched + decoded.sampled + decoded.batch_one * BATCH_ONE_SLOWDOWN
        validation_min = validation_tokens_at_batch_rate / generate_rate / 60
        overhead_min = FIXED_OVERHEAD_MINUTES + params_b * 0.25
        total_min = generation_min + training_min + validation_min + overhead_min
        peak_gb = training_memory_estimate(spec, params_b, count).peak_gb
        estimates.append(
            GpuEstimate(
                gpu_class=gpu.name, gpu_count=count, price_per_gpu_hour_usd=gpu.price_per_hour_usd,
                generation_minutes=round(generation_min, 2), training_minutes=round(training_min, 2),
                validation_minutes=round(validation_min, 2), overhead_minutes=round(overhead_min, 2),
                total_minutes=round(total_min, 2),
                cost_usd=round(total_min / 60 * gpu.price_per_hour_usd * count, 2),
                training_limited_by=limited_by,  # type: ignore[arg-type]
                training_peak_memory_gb=peak_gb, training_fits=peak_gb <= gpu.memory_gb,
            )
        )
    memory = training_memory_estimate(spec, params_b, 1)
    return EstimateOut(
        presets=_preset_estimates(spec, gpu_class, gpu_count, params_b, active_b, uploaded_prompts) if with_presets
        else [],
        prompts=prompts,
        holdout_prompts=holdout,
        tokens_to_generate=tokens_to_generate,
        training_steps=spec.training.max_steps,
        drafter_tokens_per_step=tokens_per_step,
        target_parameters_billion=params_b,
        target_active_parameters_billion=active_b,
        training_memory=memory,
        estimates=estimates,
        assumptions=[
            size_note,
            active_note,
            "tokens_to_generate is an upper bound: every prompt answered to max_new_tokens",
            prompts_note,
            "throughput scales as 1/target size; table values are per GPU for a 1B target "
            + "; ".join(f"{g.name}: generate {g.generate_tokens_per_s_1b:g} tok/s, train "
                        f"{g.train_tokens_per_s_1b:g} drafter tok/s, ${g.price_per_hour_usd}/h" for g in classes),
            f"multi-GPU runs keep {MULTI_GPU_EFFICIENCY:.0%} of linear scaling; GPUs added until bf16 weights "
            "+30% fit in memory",
            f"validation decodes each of its prompts once in batches and, on a GPU, twice at batch 1 "
            f"(speculatively and the greedy reference; a bfloat16 target's timed third once more), "
            f"{BATCH_ONE_SLOWDOWN:g}x slower per token, and the sampling test's draws",
            _memory_note(memory),
            f"fixed overhead {FIXED_OVERHEAD_MINUTES:g} min plus 0.25 min per billion parameters to load the target",
        ],
    )
