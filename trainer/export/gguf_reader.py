"""Read a DFlash GGUF back into the reference (dflash.model) config and parameter names.

The round trip is how the export is checked: a `DFlash2DraftModel` / `DFlashDraftModel` built
from the returned config must `load_state_dict` the returned tensors (dequantised to float32)
and behave like the drafter that was exported, up to the storage type's rounding.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from trainer.errors import DrafterError
from trainer.export.gguf_writer import ARCH, GLOBAL_TENSOR_NAMES, LAYER_TENSOR_NAMES

_GLOBAL_BY_GGUF = {g: r for r, g in GLOBAL_TENSOR_NAMES.items()}
_LAYER_BY_GGUF = {g: r for r, g in LAYER_TENSOR_NAMES.items()}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


def gguf_to_reference_name(name: str) -> str:
    if name in _GLOBAL_BY_GGUF:
        return _GLOBAL_BY_GGUF[name]
    match = _BLOCK.match(name)
    if match and match.group(2) in _LAYER_BY_GGUF:
        return f"layers.{match.group(1)}.{_LAYER_BY_GGUF[match.group(2)]}"
    raise DrafterError(f"GGUF tensor {name!r} is not part of a DFlash drafter")


def read_gguf_drafter(path: Path | str, *, released_codebook_names: bool = False
                      ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Return (config dict for transformers' Qwen3Config, float32 state dict).

    The selector codebooks come back as `candidate_selector.*_codebook.weight` (what
    `load_state_dict` expects) unless `released_codebook_names`, which drops the `.weight` the way
    released DFlash 2 checkpoints store them."""
    reader = gguf.GGUFReader(Path(path))
    arch = _value(reader, "general.architecture")
    if arch != ARCH:
        raise DrafterError(f"{path}: general.architecture is {arch!r}, not {ARCH!r}; not a DFlash drafter GGUF")
    state_dict: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = gguf_to_reference_name(tensor.name)
        if released_codebook_names and name.removesuffix(".weight") in _CODEBOOKS:
            name = name.removesuffix(".weight")
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        state_dict[name] = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
    return _config(reader, {t.name for t in reader.tensors}), state_dict


def _value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _decimal(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def _config(reader: gguf.GGUFReader, tensor_names: set[str]) -> dict[str, Any]:
    def arch_value(suffix: str, default: Any = None) -> Any:
        return _value(reader, f"{ARCH}.{suffix}", default)

    hidden = int(arch_value("embedding_length"))
    heads = int(arch_value("attention.head_count"))
    head_dim = int(arch_value("attention.key_length", hidden // heads))
    layers = int(arch_value("block_count"))
    target_layer_ids = [int(i) - 1 for i in arch_value("target_layers")]
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise DrafterError("the GGUF has no tokenizer.ggml.tokens; it was not written for a target vocabulary")

    rope: dict[str, Any] = {"rope_type": "default"}
    if (theta := arch_value("rope.freq_base")) is not None:
        rope["rope_theta"] = _decimal(theta)
    scaling = arch_value("rope.scaling.type")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_decimal(arch_value("rope.scaling.factor")))
    if scaling == "yarn":
        rope["original_max_position_embeddings"] = int(arch_value("rope.scaling.original_context_length"))
        for key, name in (("yarn_ext_factor", "extrapolation_factor"), ("yarn_attn_factor", "attention_factor"),
                          ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := arch_value(f"rope.scaling.{key}")) is not None:
                rope[name] = _decimal(value)
    if (rotary_dims := arch_value("rope.dimension_count")) is not None and int(rotary_dims) != head_dim:
        rope["partial_rotary_factor"] = int(rotary_dims) / head_dim

    dflash: dict[str, Any] = {"block_size": int(arch_value("block_size", 16)),
                              "target_layer_ids": target_layer_ids}
    if (mask_id := _value(reader, "tokenizer.ggml.mask_token_id")) is not None:
        dflash["mask_token_id"] = int(mask_id)
    is_dflash2 = "selector_hidden.weight" in tensor_names
    if is_dflash2:
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            dflash[key] = int(arch_value(key))
    for key, name in (("logit_scale", "output_multiplier"),
                      ("final_logit_softcapping", "final_logit_softcapping"),
                      ("embedding_scale", "input_embedding_scale"),
                      ("attention.value_scale", "attention_value_scale")):
        if (value := arch_value(key)) is not None:
            dflash[name] = _decimal(value)

    config: dict[str, Any] = {
        "architectures": ["DFlash2DraftModel" if is_dflash2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": int(arch_value("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(arch_value("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": _decimal(arch_value("attention.layer_norm_rms_epsilon")),
        "rope_parameters": rope,
        "vocab_size": len(tokens.data),
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "tie_word_embeddings": False,
        # GGUF does not record the target's depth; the reference reads it only to derive
        # target_layer_ids when they are absent, so the smallest depth that fits them is enough.
        "num_target_layers": max(target_layer_ids) + 1,
        "dflash_config": dflash,
    }
    if (n_ctx := arch_value("context_length")) is not None:
        config["max_position_embeddings"] = int(n_ctx)
    if (window := arch_value("attention.sliding_window")) is not None:
        pattern = arch_value("attention.sliding_window_pattern", [True] * layers)
        config.update(use_sliding_window=True, sliding_window=int(window),
                      layer_types=["sliding_attention" if s else "full_attention" for s in pattern])
    if (causal := arch_value("attention.causal")) is not None:
        config["is_causal"] = bool(causal)
    return config
