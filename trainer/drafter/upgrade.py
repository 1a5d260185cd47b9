"""A parent drafter made into the drafter a job trains: upgrades instead of refusals.

What a job may differ in from its parent, and how the parent's weights carry over:

- variant: a DFlash parent (or a DSpark drafter's DFlash backbone) starts a DFlash 2 drafter. The new parts start
  neutral (`neutral_dflash2_parts`): every convolution the identity (base kernel 1 on the current position, 0 on
  the previous, no dynamic correction) and the selector's successor codebook zero, so the pair score is 0 and
  the walk picks the drafter's own argmax. Untrained, the upgraded drafter drafts exactly the parent's tokens
  (tests/trainer/test_parent_formats.py proves it against the reference package running the parent as DFlash).
  A DFlash 2 parent cannot start a DFlash job: its trained convolutions and selector have no DFlash form.
- block size: no weight depends on it (attention, convolutions and selector act per position, the convolution's
  taps never leave a block, positions are absolute), so the parent's weights serve any block size.
- taps: kept from the parent unless the job names its own; then `fc`'s input columns move with their tap, a tap
  the parent did not read starts at zero weight (it adds nothing until trained) and a tap the job drops is no
  longer read.
- draft vocabulary: no weight depends on which tokens are drafted (the head is the target's); the parent's size
  is kept and the tokens are ranked again on the job's own responses (trainer/training/loop.py), and the imported
  drafter keeps the parent's own tokens so that, untrained, it drafts what the parent drafted.
- the parent's own widths (layer widths, norms' epsilon, RoPE base, the DFlash 2 kernel, group, rank and top-k):
  kept, since the weights were fitted to them; the job's shape takes only what must be the target's.

What cannot carry over is refused before any compute (trainer/training/init.py `warm_start_mismatches`): another
target's hidden size, vocabulary or depth, another number of layers, another mask token.
"""

from __future__ import annotations

import torch

from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter, DynamicConv

PARENT_WIDTHS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                 "rope_theta", "max_position_embeddings", "input_embedding_scale", "draft_vocab_size")
"""What the new drafter takes from its parent rather than from the job's shape: what the weights were fitted to."""
DFLASH2_WIDTHS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def upgraded_config(parent: DrafterConfig, config: DrafterConfig) -> DrafterConfig:
    """The job's shape (variant, block size, taps, the new target's fingerprint) with the parent's own widths."""
    kept = {name: getattr(parent, name) for name in PARENT_WIDTHS}
    if parent.variant == "dflash2":
        kept.update({name: getattr(parent, name) for name in DFLASH2_WIDTHS})
    return config.replace(**kept)


def upgrades(parent: DrafterConfig, config: DrafterConfig) -> list[str]:
    """What starting `config` from `parent` changes, one line each, for the report and the model card."""
    done = []
    if parent.variant != config.variant:
        done.append("DFlash to DFlash 2: identity convolutions and an argmax selector, so its first drafts are "
                    "the parent's")
    if parent.block_size != config.block_size:
        done.append(f"block size {parent.block_size} to {config.block_size} (no weight depends on it)")
    if tuple(parent.target_layer_ids) != tuple(config.target_layer_ids):
        new = [t for t in config.target_layer_ids if t not in parent.target_layer_ids]
        gone = [t for t in parent.target_layer_ids if t not in config.target_layer_ids]
        done.append(f"taps {list(parent.target_layer_ids)} to {list(config.target_layer_ids)}"
                    + (f"; {new} start unread (zero weight)" if new else "")
                    + (f"; {gone} no longer read" if gone else ""))
    if parent.draft_vocab_size:
        done.append(f"its draft vocabulary of {parent.draft_vocab_size} tokens is ranked again on this job's "
                    "responses")
    widths = [f"{name} {getattr(parent, name)} (the target's {getattr(config, name)})" for name in PARENT_WIDTHS[:4]
              if getattr(parent, name) != getattr(config, name)]
    if widths:
        done.append("the parent's layer widths are kept: " + ", ".join(widths))
    return done


@torch.no_grad()
def context_projection(parent: Drafter, taps: tuple[int, ...]) -> torch.Tensor:
    """`fc` for the taps `taps`: each of the parent's taps keeps its columns, a new one gets zeros."""
    hidden = parent.config.hidden_size
    weight = parent.fc.weight
    columns = []
    for tap in taps:
        if tap in parent.config.target_layer_ids:
            index = list(parent.config.target_layer_ids).index(tap)
            columns.append(weight[:, index * hidden:(index + 1) * hidden])
        else:
            columns.append(torch.zeros_like(weight[:, :hidden]))
    return torch.cat(columns, dim=1)


@torch.no_grad()
def neutral_dflash2_parts(drafter: Drafter) -> None:
    """Start the DFlash 2 parts so that they change nothing: each convolution the identity (base kernel 1 on the
    current position, 0 on the previous, and no dynamic correction) and the selector's successor codebook zero
    (the pair score is 0, so the walk picks the logits' argmax). Set here explicitly, not left to
    Drafter.reset_parameters: that draws the convolutions' correction projections like every linear layer (its
    module walk reaches them after the convolution that zeroed them), which a from-scratch start can afford and
    an upgrade that must draft the parent's tokens cannot."""
    for conv in drafter.modules():
        if isinstance(conv, DynamicConv):
            conv.base_kernel.zero_()
            conv.base_kernel[:, 0] = 1.0
            conv.kernel_projection.weight.zero_()
    if drafter.candidate_selector is not None:
        drafter.candidate_selector.successor_codebook.weight.zero_()


@torch.no_grad()
def upgrade_drafter(parent: Drafter, config: DrafterConfig) -> Drafter:
    """A drafter of `config` (the job's shape; see `upgraded_config`) holding the parent's weights, its new
    DFlash 2 parts at their neutral start. The caller seeds torch first: the selector's predecessor codebook and
    projection are still drawn, silenced by the zero successor codebook (trainer/training/init.py seeds, so every
    rank agrees)."""
    drafter = Drafter(upgraded_config(parent.config, config))
    state = parent.state_dict()
    state["fc.weight"] = context_projection(parent, tuple(config.target_layer_ids))
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    new_parts = [name for name in missing if ".attention_conv." in name or ".mlp_conv." in name
                 or name.startswith("candidate_selector.")]
    if unexpected or len(new_parts) != len(missing) or (missing and parent.config.variant == "dflash2"):
        raise ValueError(f"upgrade of a {parent.config.variant} parent to {config.variant}: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")  # a bug of ours: the rules above forbid it
    if missing:  # a DFlash parent: its new DFlash 2 parts
        neutral_dflash2_parts(drafter)
    drafter.draft_vocab = parent.draft_vocab
    return drafter.to(dtype=parent.fc.weight.dtype)
