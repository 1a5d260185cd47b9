"""A sound starting point for a drafter, taken from its target.

The drafter feeds the target's own LM head, which expects hidden states scaled by the target's final
norm: that norm is copied. With `init="target"` the drafter's layers also start as copies of the target's
last layers (same shapes by construction): their attention and MLP already map the target's feature
space to next-token features, which the drafter only has to re-wire to the block and its context.
"""

from __future__ import annotations

import torch

from trainer.drafter.model import Drafter
from trainer.targets.loading import Target

LAYER_PARAMETERS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
)


@torch.no_grad()
def init_from_target(drafter: Drafter, target: Target, mode: str = "target") -> None:
    final_norm = target.model.get_decoder().norm.weight
    drafter.norm.weight.copy_(final_norm.to(drafter.norm.weight.dtype))
    if mode != "target":
        return
    first = target.num_layers - len(drafter.layers)
    for index, layer in enumerate(drafter.layers):
        source = dict(target.layers[first + index].named_parameters())
        own = dict(layer.named_parameters())
        for name in LAYER_PARAMETERS:
            # Targets without q/k norms (Llama, Mistral, Qwen2) leave the drafter's at 1.
            if name in source and source[name].shape == own[name].shape:
                own[name].copy_(source[name].to(own[name].dtype))
