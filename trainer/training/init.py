"""A sound starting point for a drafter, taken from its target and its data.

- `fc` is whitened: the target's hidden states carry a few "massive" channels (hundreds of times the
  others on every token), which would dominate a plain random projection and, after `hidden_norm`, leave
  every context token looking alike. Each input channel is divided by its RMS over the training data.
- With `init="target"` the drafter's layers start as copies of the target's last layers (same shapes by
  construction) and its final norm as the target's, whose LM head it feeds. The copied layers expect a
  residual stream at the scale of the target's late layers, so the block's embeddings are scaled to it
  (`input_embedding_scale`, a key of the reference format); otherwise their first output would drown the
  anchor's identity.
- With `init="random"`: N(0, 0.02) layers and a unit final norm.
Convolutions start as the identity and the selector as plain argmax either way (Drafter.reset_parameters).
- With `init="drafter:DIR"` (a warm start): every weight is the drafter in DIR's, which must have
  this drafter's shape exactly (`check_warm_start` names each difference and the job field that fixes it).
  The new drafter records the new target's fingerprint; no statistics are taken (its `fc` is trained).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.data.store import Example
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.errors import DrafterError
from trainer.targets.loading import Target
from trainer.training.config import WARM_START_PREFIX

LAYER_PARAMETERS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
)


@dataclass(frozen=True)
class ContextStatistics:
    channel_rms: torch.Tensor
    """(taps*H,) RMS of every context channel over the sampled tokens."""
    last_tap_token_rms: float
    """Median over tokens of the RMS of the last tap: the scale of the target's late residual stream."""


@torch.no_grad()
def context_statistics(examples: list[Example], target: Target, tap_layer_ids: list[int],
                       max_examples: int = 64) -> ContextStatistics:
    rows = []
    for example in examples[:max_examples]:
        hidden = example.hidden
        if hidden is None:
            _, hidden = target.forward(torch.tensor([example.input_ids], device=target.device),
                                       tap_layer_ids=tap_layer_ids)
            hidden = hidden[0]
        rows.append(hidden[1:].float().cpu())  # position 0 is the attention sink: an outlier by design
    sample = torch.cat(rows)
    width = sample.shape[1] // len(tap_layer_ids)
    last = sample[:, -width:]
    return ContextStatistics(sample.pow(2).mean(0).sqrt().clamp_min(1e-6),
                             float(last.pow(2).mean(-1).sqrt().median()))


def embedding_scale(target: Target, stats: ContextStatistics) -> float:
    embedding_rms = float(target.embedding_weight.float().pow(2).mean().sqrt())
    return round(stats.last_tap_token_rms / embedding_rms, 3)


def prepare_config(config: DrafterConfig, target: Target, stats: ContextStatistics, mode: str) -> DrafterConfig:
    if mode == "target" and config.input_embedding_scale is None:
        return config.replace(input_embedding_scale=embedding_scale(target, stats))
    return config


class IncompatibleDrafter(DrafterError):
    """A drafter cannot serve as the starting point (or be measured) here: its shape differs."""

    code = "incompatible_drafter"


SHAPE_FIELDS = ("variant", "hidden_size", "intermediate_size", "num_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers", "target_layer_ids",
                "block_size", "mask_token_id", "conv_kernel_size", "conv_group_size", "selector_rank",
                "selector_top_k")
"""What a warm start must share with its parent: every tensor shape and every input the weights were fitted to."""
JOB_FIELDS = {"variant": "drafter.variant", "num_layers": "drafter.num_layers", "block_size": "drafter.block_size",
              "target_layer_ids": "drafter.target_layer_ids", "mask_token_id": "drafter.mask_token_id"}


def warm_start_mismatches(parent: DrafterConfig, config: DrafterConfig) -> list[str]:
    """Each difference between the parent's shape and this job's, with what fixes it."""
    problems = []
    for name in SHAPE_FIELDS:
        had, wants = getattr(parent, name), getattr(config, name)
        if had != wants:
            had, wants = (list(v) if isinstance(v, tuple) else v for v in (had, wants))
            fix = (f"set {JOB_FIELDS[name]} to {had!r} or train from scratch" if name in JOB_FIELDS
                   else "the target differs in shape: train from scratch")
            problems.append(f"{name} is {had!r} in the parent but {wants!r} here ({fix})")
    return problems


def check_warm_start(parent: DrafterConfig, config: DrafterConfig, where: str) -> None:
    problems = warm_start_mismatches(parent, config)
    if problems:
        raise IncompatibleDrafter(f"cannot warm-start from the drafter {where}: " + "; ".join(problems))


def warm_start_drafter(config: DrafterConfig, parent_dir: str) -> Drafter:
    """A drafter of `config` (this job's shape, the new target's fingerprint) holding the parent's weights."""
    from trainer.drafter.checkpoint import load_drafter

    parent = load_drafter(parent_dir)
    check_warm_start(parent.config, config, parent_dir)
    drafter = Drafter(config.replace(input_embedding_scale=parent.config.input_embedding_scale,
                                     draft_vocab_size=parent.config.draft_vocab_size))
    drafter.load_state_dict(parent.state_dict())
    return drafter


def initial_drafter(config: DrafterConfig, target: Target, examples: list[Example], mode: str, seed: int) -> Drafter:
    """The drafter training starts from (float32, CPU): statistics of the data, then `init_from_target`; or,
    with mode `drafter:DIR`, the weights of an earlier drafter (a warm start)."""
    if mode.startswith(WARM_START_PREFIX):
        return warm_start_drafter(config, mode.removeprefix(WARM_START_PREFIX))
    stats = context_statistics(examples, target, list(config.target_layer_ids))
    torch.manual_seed(seed)  # identical initial weights on every rank
    drafter = Drafter(prepare_config(config, target, stats, mode))
    init_from_target(drafter, target, stats, mode)
    return drafter


@torch.no_grad()
def init_from_target(drafter: Drafter, target: Target, stats: ContextStatistics, mode: str = "target") -> None:
    inputs = drafter.fc.weight.shape[1]
    drafter.fc.weight.copy_(torch.randn_like(drafter.fc.weight) / inputs ** 0.5 / stats.channel_rms.to(drafter.fc.weight))
    if mode != "target":
        return
    drafter.norm.weight.copy_(target.model.get_decoder().norm.weight.to(drafter.norm.weight.dtype))
    first = target.num_layers - len(drafter.layers)
    for index, layer in enumerate(drafter.layers):
        source = dict(target.layers[first + index].named_parameters())
        own = dict(layer.named_parameters())
        for name in LAYER_PARAMETERS:
            # Targets without q/k norms (Llama, Mistral, Qwen2) leave the drafter's at 1.
            if name in source and source[name].shape == own[name].shape:
                own[name].copy_(source[name].to(own[name].dtype))
