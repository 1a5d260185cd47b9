"""Peak GPU memory of one training step, per GPU, before a job runs (the estimate's `training_memory`).

A pure function of sizes, like trainer/targets/placement.py; the API cannot open the target, so the drafter's shape
is a published model's of about the target's size (`reference_shape`). What one step holds:

- the target's weights (every rank holds a whole target: it computes the taps of uncached data online);
- the drafter's weights, gradients and AdamW state (float32 master weights and moments in bfloat16 training); ZeRO
  stage 2 shards the gradients and optimizer state over the GPUs, stage 3 the weights too;
- attention: training's masked attention runs on CUDA's memory-efficient kernel (trainer/drafter/attention.py), which
  keeps one additive bias (batch x queries x keys) for the step and, per layer, K/V expanded to the query heads; the
  float32 math kernel it replaced kept batch x heads x queries x keys float32 scores per layer (`math_attention_gb`,
  reported so the difference is visible);
- the other activations kept for the backward: per layer and block token about ten hidden-size vectors and three
  intermediate-size ones; the context's taps and its per-layer keys/values.
The LM head's cross-entropy is chunked (kernels/linear_cross_entropy.py) and adds no term of note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
ASSUMED_PROMPT_TOKENS = 96
"""A prompt's tokens with the chat template (the built-in prompts are shorter; an uploaded set may be longer)."""
SELECTOR_RANK = 256


@dataclass(frozen=True)
class ModelShape:
    name: str
    parameters_billion: float
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


REFERENCE_SHAPES = (
    ModelShape("SmolLM2-135M", 0.135, 576, 1536, 9, 3, 64, 49152),
    ModelShape("Qwen2.5-0.5B", 0.49, 896, 4864, 14, 2, 64, 151936),
    ModelShape("Llama-3.2-1B", 1.24, 2048, 8192, 32, 8, 64, 128256),
    ModelShape("Llama-3.2-3B", 3.21, 3072, 8192, 24, 8, 128, 128256),
    ModelShape("Llama-3.1-8B", 8.03, 4096, 14336, 32, 8, 128, 128256),
    ModelShape("Qwen3-14B", 14.8, 5120, 17408, 40, 8, 128, 151936),
    ModelShape("Qwen3-32B", 32.8, 5120, 25600, 64, 8, 128, 151936),
    ModelShape("Llama-3.1-70B", 70.6, 8192, 28672, 64, 8, 128, 128256),
)


def reference_shape(parameters_billion: float) -> ModelShape:
    """The published shape nearest in size (on a log scale) to a target of `parameters_billion`."""
    return min(REFERENCE_SHAPES, key=lambda s: abs(math.log(s.parameters_billion / parameters_billion)))


@dataclass(frozen=True)
class TrainingMemory:
    peak_gb: float
    target_weights_gb: float
    drafter_states_gb: float
    attention_gb: float
    activations_gb: float
    math_attention_gb: float
    """What the attention alone would hold on the float32 math kernel (the path before the fused one)."""
    sequence_tokens: int
    block_queries: int


def drafter_parameters(shape: ModelShape, num_layers: int, taps: int, dflash2: bool) -> int:
    h, i = shape.hidden, shape.intermediate
    attention = h * shape.heads * shape.head_dim * 2 + h * shape.kv_heads * shape.head_dim * 2
    layer = attention + 3 * h * i + 4 * h
    if dflash2:  # two dynamic convolutions: base kernels and one correction per 16 channels, 2 taps
        layer += 2 * (2 * 2 * h + h * 2 * 2 * (h // 16))
    selector = 2 * shape.vocab * SELECTOR_RANK + h * SELECTOR_RANK if dflash2 else 0
    return num_layers * layer + taps * h * h + 2 * h + selector


def training_memory(shape: ModelShape, *, target_parameters_billion: float, dtype_bytes: int, num_layers: int,
                    block_size: int, anchors_per_sequence: int, batch_size: int, max_new_tokens: int, taps: int,
                    dflash2: bool, gpu_count: int, zero_stage: int) -> TrainingMemory:
    """One training step's peak on each GPU (module docstring)."""
    sequence = ASSUMED_PROMPT_TOKENS + max_new_tokens
    anchors = max(1, min(anchors_per_sequence, max_new_tokens - 1))  # response tokens followed by one
    queries = anchors * block_size
    keys = sequence + queries
    b, heads = batch_size, shape.heads
    params = drafter_parameters(shape, num_layers, taps, dflash2)
    optimizer_bytes = 12 if dtype_bytes == 2 else 8  # fp32 master + two moments, or the two moments
    sharded = (dtype_bytes + optimizer_bytes) / max(gpu_count, 1) if zero_stage >= 2 else dtype_bytes + optimizer_bytes
    weights = dtype_bytes / max(gpu_count, 1) if zero_stage >= 3 else dtype_bytes
    drafter_states = params * (weights + sharded)
    bias = b * queries * keys * dtype_bytes
    expanded_kv = 2 * b * heads * keys * shape.head_dim * dtype_bytes
    attention = bias + num_layers * (expanded_kv + b * heads * queries * 4)
    scores = b * heads * queries * keys * 4
    math_attention = b * queries * keys + num_layers * scores + 2 * scores  # the boolean mask; kept + in flight
    per_token = (10 * shape.hidden + 3 * shape.intermediate) * dtype_bytes
    context = b * sequence * (taps * shape.hidden + num_layers * 2 * shape.kv_heads * shape.head_dim) * dtype_bytes
    activations = num_layers * b * queries * per_token + context
    target = target_parameters_billion * 1e9 * dtype_bytes
    fixed = target + drafter_states + activations
    return TrainingMemory(
        peak_gb=round((fixed + attention) / GB, 2), target_weights_gb=round(target / GB, 2),
        drafter_states_gb=round(drafter_states / GB, 2), attention_gb=round(attention / GB, 2),
        activations_gb=round(activations / GB, 2), math_attention_gb=round(math_attention / GB, 2),
        sequence_tokens=sequence, block_queries=queries,
    )
