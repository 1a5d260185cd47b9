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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.data.store import Example
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.targets.loading import Target

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


def initial_drafter(config: DrafterConfig, target: Target, examples: list[Example], mode: str, seed: int) -> Drafter:
    """The drafter training starts from (float32, CPU): statistics of the data, then `init_from_target`."""
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
