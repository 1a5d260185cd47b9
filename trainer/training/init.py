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
Convolutions start near the identity and the selector as plain argmax either way (Drafter.reset_parameters).
- With `init="drafter:DIR"` (a warm start): every weight is the drafter in DIR's, in any format of the field
  (trainer/drafter/formats.py: ours, z-lab's reference format, vLLM speculators', SpecForge's, a DSpark
  drafter's backbone), upgraded to this job's variant, block size and taps (trainer/drafter/upgrade.py); what
  no upgrade bridges is refused (`check_warm_start` names each difference and the job field that fixes it).
  The new drafter records the new target's fingerprint; no statistics are taken (its `fc` is trained).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.lineage import VARIANT_UPGRADES
from schemas.work_files import ParentOrigin
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


JOB_FIELDS = {"variant": "drafter.variant", "num_layers": "drafter.num_layers",
              "mask_token_id": "drafter.mask_token_id"}
"""What a parent must share with the job, and the job field that makes it so. Everything else is upgraded
(trainer/drafter/upgrade.py): block size, taps, DFlash to DFlash 2, the draft vocabulary, the parent's widths."""
SHAPE_FIELDS = ("hidden_size", "vocab_size", "num_target_layers", *JOB_FIELDS)
"""What a warm start checks, the target's three first: its drafts are read through the target's embedding and head."""
OTHER_TARGET = ("the parent drafts for another target: give the base model's own drafter in init.from_drafter, or "
                "train from scratch")


def parent_target_mismatches(parent: DrafterConfig, *, hidden_size: int, vocab_size: int, num_layers: int) -> list[str]:
    """Where the parent cannot serve a target of this hidden size, vocabulary and depth, with what fixes it."""
    beyond = [t for t in parent.target_layer_ids if t >= num_layers]
    problems = [f"{name} is {had!r} in the parent but {wants!r} here ({OTHER_TARGET})"
                for name, had, wants in (("hidden_size", parent.hidden_size, hidden_size),
                                         ("vocab_size", parent.vocab_size, vocab_size),
                                         ("num_target_layers", parent.num_target_layers, num_layers))
                if had != wants and not (name == "num_target_layers" and beyond)]  # the taps say it better
    if beyond:
        problems.append(f"target_layer_ids {list(parent.target_layer_ids)} of the parent tap layers {beyond} this "
                        f"{num_layers}-layer target lacks (set drafter.target_layer_ids to taps below {num_layers}, "
                        "or give the base model's own drafter in init.from_drafter)")
    if parent.mask_token_id >= vocab_size:
        problems.append(f"mask_token_id {parent.mask_token_id} of the parent is outside this target's vocabulary of "
                        f"{vocab_size} (set drafter.mask_token_id, or give the base model's own drafter)")
    return problems


def warm_start_mismatches(parent: DrafterConfig, config: DrafterConfig) -> list[str]:
    """Each difference between the parent and this job that no upgrade bridges, with what fixes it."""
    problems = parent_target_mismatches(parent, hidden_size=config.hidden_size, vocab_size=config.vocab_size,
                                        num_layers=config.num_target_layers)
    for name, field in JOB_FIELDS.items():
        had, wants = getattr(parent, name), getattr(config, name)
        if had == wants or (name == "variant" and (had, wants) in VARIANT_UPGRADES):
            continue
        if name == "mask_token_id":
            fix = f"set {field} to {had!r} or leave it unset to keep the parent's, or train from scratch"
        elif name == "variant":
            fix = (f"set {field} to {had!r} (a DFlash 2 parent's convolutions and selector have no DFlash form) "
                   "or train from scratch")
        else:
            fix = f"set {field} to {had!r} or train from scratch"
        problems.append(f"{name} is {had!r} in the parent but {wants!r} here ({fix})")
    return list(dict.fromkeys(problems))


def check_warm_start(parent: DrafterConfig, config: DrafterConfig, where: str) -> None:
    problems = warm_start_mismatches(parent, config)
    if problems:
        raise IncompatibleDrafter(f"cannot warm-start from the drafter {where}: " + "; ".join(problems))


@dataclass
class UpgradedParent:
    """A warm start's first drafter and where its parent came from (format, variant, what was upgraded or
    dropped), for prepare.json, the report and the model card."""

    drafter: Drafter
    origin: ParentOrigin


def start_from_parent(config: DrafterConfig, parent_dir: str) -> UpgradedParent:
    """The parent in `parent_dir`, in any format trainer/drafter/formats.py reads, checked against this job's
    shape `config` and upgraded to it (trainer/drafter/upgrade.py)."""
    from trainer.drafter.formats import import_drafter
    from trainer.drafter.upgrade import upgrade_drafter, upgrades

    imported = import_drafter(parent_dir, num_target_layers=config.num_target_layers)
    check_warm_start(imported.drafter.config, config, parent_dir)
    origin = imported.origin.model_copy(update={"upgrades": upgrades(imported.drafter.config, config)})
    return UpgradedParent(drafter=upgrade_drafter(imported.drafter, config), origin=origin)


def warm_start_drafter(config: DrafterConfig, parent_dir: str) -> Drafter:
    """A drafter of `config` (this job's shape, the new target's fingerprint) holding the parent's weights."""
    return start_from_parent(config, parent_dir).drafter


def initial_drafter(config: DrafterConfig, target: Target, examples: list[Example], mode: str, seed: int) -> Drafter:
    """The drafter training starts from (float32, CPU): statistics of the data, then `init_from_target`; or,
    with mode `drafter:DIR`, the weights of an earlier drafter (a warm start)."""
    torch.manual_seed(seed)  # identical initial weights on every rank (a warm start's new DFlash 2 parts too)
    if mode.startswith(WARM_START_PREFIX):
        return warm_start_drafter(config, mode.removeprefix(WARM_START_PREFIX))
    stats = context_statistics(examples, target, list(config.target_layer_ids))
    torch.manual_seed(seed)
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
