"""Typed configuration of a DFlash / DFlash 2 drafter, and its reference `config.json` form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from trainer.errors import DrafterError

Variant = Literal["dflash", "dflash2"]
ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}


def build_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """The reference rule: one middle layer, or taps spread evenly over layers 1 .. L-3."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_taps - 1)) for i in range(num_taps)]


def default_target_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list[int]:
    """The taps a drafter gets unless told otherwise: the reference rule with one tap per drafter layer,
    at least three (what released DFlash drafters use)."""
    return build_target_layer_ids(num_target_layers, max(num_drafter_layers, 3))


@dataclass(frozen=True)
class DrafterConfig:
    """Everything that defines a drafter's shape. Attention/MLP shapes copy the target's."""

    variant: Variant
    """`dflash2` adds the dynamic convolutions and the candidate selector to `dflash`."""
    hidden_size: int
    """Equal to the target's: the drafter reads the target's embeddings and feeds its LM head."""
    intermediate_size: int
    """SwiGLU width of each drafter layer."""
    num_layers: int
    """Drafter decoder layers."""
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    """RoPE base; the drafter uses absolute target positions."""
    max_position_embeddings: int
    vocab_size: int
    """Rows of the target's embedding; the selector codebooks have one row per token."""
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    """Target layers whose outputs (HF hidden_states[id + 1]) condition the drafter."""
    block_size: int
    """Verified tokens per cycle: the anchor plus block_size - 1 drafts."""
    mask_token_id: int
    """Token whose embedding fills the masked block positions."""
    conv_kernel_size: int = 2
    """DFlash 2: taps of the dynamic convolution (the current and the previous position)."""
    conv_group_size: int = 16
    """DFlash 2: channels sharing one dynamic correction."""
    selector_rank: int = 256
    """DFlash 2: rank r of the selector's codebooks."""
    selector_top_k: int = 16
    """DFlash 2: candidates per position the selector chooses from."""
    input_embedding_scale: float | None = None
    """Multiplies the target's token embeddings fed to the block (the reference's optional key). Set at
    target-layer init so the block's residual stream has the scale the copied layers expect."""
    target_fingerprint: str | None = None
    """Hash of the target's tokenizer and embedding; a drafter refuses any other target."""
    recommended_block_size: int | None = None
    """The draft length validation found fastest on its machine (export writes it; `draftsmith decode` uses it)."""
    draft_vocab_size: int | None = None
    """Draft among this many of the target's most frequent tokens (trainer/drafter/draft_vocab.py; the
    table itself is `draft_vocab.safetensors` next to the weights); None: the whole vocabulary."""

    def __post_init__(self) -> None:
        if self.variant not in ARCHITECTURES:
            raise DrafterError(f"variant must be one of {sorted(ARCHITECTURES)}, got {self.variant!r}")
        if not 2 <= self.block_size <= 64:
            raise DrafterError(f"block_size must be in [2, 64], got {self.block_size}")
        # The last layer is tapped after the target's final norm (HF hidden_states[L], as the reference reads it).
        if not self.target_layer_ids or any(not 0 <= i < self.num_target_layers for i in self.target_layer_ids):
            raise DrafterError(f"target_layer_ids {list(self.target_layer_ids)} must be non-empty and within "
                               f"[0, {self.num_target_layers - 1}] for a {self.num_target_layers}-layer target")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DrafterError(f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise DrafterError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, {self.vocab_size}]")
        if self.variant == "dflash2" and self.hidden_size % self.conv_group_size:
            raise DrafterError(f"hidden_size {self.hidden_size} must be a multiple of conv_group_size "
                               f"{self.conv_group_size}")

    @classmethod
    def for_target(cls, target, *, variant: Variant = "dflash2", num_layers: int = 2, block_size: int = 8,
                   mask_token_id: int, target_layer_ids: list[int] | None = None, num_taps: int | None = None,
                   **overrides) -> DrafterConfig:
        """A drafter shaped for `target` (a trainer.targets.Target). Taps default to the reference rule
        with one tap per drafter layer, at least three (what released DFlash drafters use)."""
        config = target.config
        # A target without attention (a pure state-space model: Mamba) has no heads to copy: the drafter's own
        # attention gets Qwen3's shape, heads of 128 (64 below a hidden size of 128).
        heads, kv_heads = (_global_setting(config, "num_attention_heads"),
                           _global_setting(config, "num_key_value_heads"))
        if not heads:
            heads = kv_heads = max(1, config.hidden_size // (128 if config.hidden_size >= 128 else 64))
        kv_heads = kv_heads or heads  # no grouped-query setting (GPT-2, OPT, RoBERTa): one key/value head per head
        head_dim = _global_setting(config, "head_dim") or config.hidden_size // heads
        rope = _global_setting(config, "rope_parameters") or {}
        if "full_attention" in rope:  # per layer kind (Gemma): the drafter attends like the full layers
            rope = rope["full_attention"] or {}  # (None where the full layers use no rotary embedding)
        taps = target_layer_ids or (build_target_layer_ids(target.num_layers, num_taps) if num_taps
                                    else default_target_layer_ids(target.num_layers, num_layers))
        if overrides.get("draft_vocab_size") and overrides["draft_vocab_size"] >= target.vocab_size:
            overrides["draft_vocab_size"] = None  # a draft vocabulary as large as the vocabulary saves nothing
        return cls(
            variant=variant, hidden_size=config.hidden_size, intermediate_size=_mlp_width(config),
            num_layers=num_layers, num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=_norm_eps(config),
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            max_position_embeddings=getattr(config, "max_position_embeddings", None) or 32768,
            vocab_size=target.vocab_size,
            num_target_layers=target.num_layers, target_layer_ids=tuple(taps), block_size=block_size,
            mask_token_id=mask_token_id, target_fingerprint=target.fingerprint, **overrides,
        )

    def replace(self, **changes) -> DrafterConfig:
        return dataclasses.replace(self, **changes)

    # --- the reference checkpoint format -------------------------------------------------------

    def to_hf_dict(self) -> dict:
        """config.json as `dflash.model.DFlash(2)DraftModel.from_pretrained` reads it (a Qwen3 config)."""
        dflash_config = {
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": list(self.target_layer_ids),
        }
        if self.input_embedding_scale is not None:
            dflash_config["input_embedding_scale"] = self.input_embedding_scale
        if self.variant == "dflash2":
            dflash_config.update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size,
                                 selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        out = {
            "architectures": [ARCHITECTURES[self.variant]],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": dflash_config,
            "dtype": "float32",
        }
        ours = {"target_fingerprint": self.target_fingerprint, "draft_vocab_size": self.draft_vocab_size,
                "recommended_block_size": self.recommended_block_size}
        if any(v is not None for v in ours.values()):
            out["draftsmith"] = {k: v for k, v in ours.items() if v is not None}
        return out

    @classmethod
    def from_hf_dict(cls, data: dict) -> DrafterConfig:
        """Reads the reference format, and the top-level `draft_vocab_size` of a vLLM-layout export."""
        try:
            architecture = (data.get("architectures") or [None])[0]
            variant = {v: k for k, v in ARCHITECTURES.items()}.get(architecture)
            if variant is None:
                raise DrafterError(f"config.json architectures {data.get('architectures')} is not a DFlash drafter; "
                                   f"expected one of {sorted(ARCHITECTURES.values())}")
            dflash = data["dflash_config"]
            rope = data.get("rope_parameters") or {}
            extra = {}
            if variant == "dflash2":
                extra = {k: int(dflash[k]) for k in ("conv_kernel_size", "conv_group_size",
                                                     "selector_rank", "selector_top_k")}
            return cls(
                variant=variant, hidden_size=data["hidden_size"], intermediate_size=data["intermediate_size"],
                num_layers=data["num_hidden_layers"], num_attention_heads=data["num_attention_heads"],
                num_key_value_heads=data["num_key_value_heads"],
                head_dim=data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"],
                rms_norm_eps=data["rms_norm_eps"],
                rope_theta=float(rope.get("rope_theta", data.get("rope_theta", 10000.0))),
                max_position_embeddings=data["max_position_embeddings"], vocab_size=data["vocab_size"],
                num_target_layers=data["num_target_layers"],
                target_layer_ids=tuple(dflash["target_layer_ids"]),
                block_size=int(dflash.get("block_size", data.get("block_size", 16))),
                mask_token_id=int(dflash["mask_token_id"]),
                input_embedding_scale=dflash.get("input_embedding_scale"),
                target_fingerprint=(data.get("draftsmith") or {}).get("target_fingerprint"),
                draft_vocab_size=_draft_vocab_size(data),
                recommended_block_size=(data.get("draftsmith") or {}).get("recommended_block_size"),
                **extra,
            )
        except KeyError as exc:
            raise DrafterError(f"drafter config.json lacks the field {exc.args[0]!r}") from exc


def _draft_vocab_size(data: dict) -> int | None:
    """Ours (`draftsmith.draft_vocab_size`) or vLLM's top-level key; one equal to the vocabulary means none."""
    size = (data.get("draftsmith") or {}).get("draft_vocab_size") or data.get("draft_vocab_size")
    return None if size is None or size == data.get("vocab_size") else int(size)


NORM_EPS_KEYS = ("rms_norm_eps", "norm_eps", "layer_norm_epsilon", "layer_norm_eps")
"""What architectures call their norms' epsilon (Llama/Qwen, LFM2, Nemotron-H, ...): the drafter's norms use it."""


MLP_WIDTH_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
"""What architectures call their MLP's width (OPT's ffn_dim, GPT-2's n_inner, ...). A target with none (an MoE
whose dense width is its experts', MPT) gives the drafter Qwen3's ratio, 3 x hidden."""


def _mlp_width(config) -> int:
    return next((int(value) for key in MLP_WIDTH_KEYS if (value := getattr(config, key, None))), 3 * config.hidden_size)


def _norm_eps(config) -> float:
    return next((float(value) for key in NORM_EPS_KEYS if (value := getattr(config, key, None)) is not None), 1e-6)


def _global_setting(config, name: str):
    """A target config value as its config.json holds it. transformers refuses attribute access to a value a
    model may set per layer (Gemma 4's head_dim): the global value is what the drafter's own layers copy."""
    try:
        return getattr(config, name, None)
    except RuntimeError:  # AmbiguousGlobalPerLayerAttributeError, in the transformers versions that have it
        return config.to_dict().get(name)
