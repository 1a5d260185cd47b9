"""Export a reference-format DFlash / DFlash 2 drafter to a GGUF file for llama.cpp.

The output is meant to be indistinguishable from what llama.cpp's own converter
(`convert_hf_to_gguf.py DRAFTER --target-model-dir TARGET`, class `DFlashModel`) writes: the same
metadata keys, values and order, the same tensor names, and the same per-tensor storage type
(norms, 1-D tensors and the conv base kernels stay F32; every other `.weight` becomes F16 or
Q8_0, Q8_0 falling back to F16 where a row is not a multiple of 32). A drafter has no embedding
or LM head of its own, so only the target's tokenizer is read from the target directory.

The vocabulary part lives in gguf_tokenizer.py (byte-level BPE targets of the Llama, Mistral
and Qwen families).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
import torch
from safetensors import safe_open

from trainer.atomic import atomic_path
from trainer.errors import DrafterError, TargetError
from trainer.export.gguf_sentencepiece import GEMMA4_FAMILY, SENTENCEPIECE_FAMILY
from trainer.export.gguf_tokenizer import BPE_FAMILY, LLAMA_FAMILY, add_tokenizer_metadata

ARCH = "dflash"
GGUFDtype = Literal["f16", "q8_0"]
_FILE_TYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
_QUANT_TYPES = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
_F32 = gguf.GGMLQuantizationType.F32
V = gguf.GGUFValueType

# Reference (dflash.model) parameter names -> GGUF names, as llama.cpp's tensor map assigns them.
GLOBAL_TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",  # only in drafters that carry a copy of the target's
    "lm_head.weight": "output.weight",
    "candidate_selector.predecessor_codebook.weight": "selector_predecessor.weight",
    "candidate_selector.successor_codebook.weight": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}
LAYER_TENSOR_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # the conv base kernels have no `.weight` suffix in either naming, hence no suffix here
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
for _hf, _gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
    for _suffix in ("weight", "bias"):
        LAYER_TENSOR_NAMES[f"self_attn.{_hf}.{_suffix}"] = f"{_gg}.{_suffix}"
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_SKIPPED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")


def reference_to_gguf_name(name: str) -> str | None:
    """GGUF name of a reference checkpoint tensor (None for buffers llama.cpp does not need)."""
    name = name.removeprefix("model.")
    if f"model.{name}".endswith(_SKIPPED_SUFFIXES):  # the suffixes include their leading dot
        return None
    if name.endswith("_codebook"):  # released spelling of the selector codebooks
        name += ".weight"
    if name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[name]
    match = _LAYER.match(name)
    if match and match.group(2) in LAYER_TENSOR_NAMES:
        return f"blk.{match.group(1)}.{LAYER_TENSOR_NAMES[match.group(2)]}"
    raise DrafterError(f"drafter tensor {name!r} has no llama.cpp DFlash counterpart; "
                       "export only reference-format (dflash.model) checkpoints")


def storage_type(gguf_name: str, ndim: int, dtype: GGUFDtype) -> gguf.GGMLQuantizationType:
    """llama.cpp keeps norms, 1-D tensors and anything that is not a `.weight` matrix in F32."""
    if ndim <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return _F32
    return _QUANT_TYPES[dtype]


class OrderedMetadata:
    """Ordered GGUF key/values. Setting a key again keeps its first position, as GGUFWriter does,
    so following llama.cpp's converter step by step reproduces its key order."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Any, gguf.GGUFValueType]] = {}

    def set(self, key: str, value: Any, vtype: gguf.GGUFValueType) -> None:
        if vtype == V.ARRAY and len(value) == 0:
            return  # GGUF cannot hold an empty array; the converter skips them too
        self.items[key] = (value, vtype)

    def arch(self, suffix: str, value: Any, vtype: gguf.GGUFValueType) -> None:
        self.set(f"{ARCH}.{suffix}", value, vtype)

    def write_to(self, writer: gguf.GGUFWriter) -> None:
        for key, (value, vtype) in self.items.items():
            writer.add_key_value(key, value, vtype)


def write_gguf(drafter_dir: Path, target_dir: Path, out_path: Path, dtype: GGUFDtype,
               *, tokenizer_pre: str | None = None, draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> Path:
    """Write the drafter as a llama.cpp DFlash GGUF and return `out_path`.

    `draft_vocab` = (sorted target ids, the target's LM head): also write the drafter's own `output.weight`
    (the head's rows for those ids, so llama.cpp's DFlash graph computes draft logits over them only) and
    `d2t` (int64, absolute target ids, as llama.cpp's DFlash and EAGLE-3 loaders read it). Without it the
    file is exactly what llama.cpp's converter writes (the drafter borrows the target's full head).

    The file appears atomically (written under a temporary name in the same directory, renamed at
    the end); on any failure nothing is left behind. Raises DrafterError / TargetError, naming the
    file and the fix, for inputs that cannot be exported. `tokenizer_pre` overrides the llama.cpp
    pre-tokenizer name for a BPE tokenizer whose probe hash is not in KNOWN_PRE_TOKENIZERS."""
    drafter_dir, target_dir, out_path = Path(drafter_dir), Path(target_dir), Path(out_path)
    if dtype not in _QUANT_TYPES:
        raise ValueError(f"GGUF dtype must be one of {sorted(_QUANT_TYPES)}, got {dtype!r}")
    hparams = _load_drafter_config(drafter_dir)
    target_config, target_arch = _check_target(target_dir)

    writer = gguf.GGUFWriter(path=None, arch=ARCH)
    try:
        with atomic_path(out_path) as tmp_path:  # fsynced and renamed (trainer/atomic.py)
            for gguf_name, data, qtype in _converted_tensors(drafter_dir, dtype):
                writer.add_tensor(gguf_name, data, raw_dtype=qtype)
            if draft_vocab is not None:
                ids, head = draft_vocab
                rows = head[ids].detach().cpu().to(torch.float32).numpy()  # .numpy() reads host memory only
                qtype = storage_type("output.weight", rows.ndim, dtype)
                writer.add_tensor("output.weight", gguf.quants.quantize(rows, qtype), raw_dtype=qtype)
                writer.add_tensor("d2t", ids.detach().cpu().to(torch.int64).numpy())
            # Metadata in the converter's order: general.*, model parameters, quantization version, vocab.
            writer.add_type(gguf.GGUFType.MODEL)
            _general_metadata(writer, drafter_dir)
            kv = OrderedMetadata()
            _model_parameters(kv, hparams, dtype)
            _dflash_parameters(kv, hparams, target_config)
            kv.set("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32)
            add_tokenizer_metadata(kv, hparams, target_dir, target_arch, tokenizer_pre)
            kv.write_to(writer)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            writer.write_header_to_file(path=tmp_path)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
    except BaseException:
        writer.close()
        raise
    return out_path


def _load_drafter_config(drafter_dir: Path) -> dict[str, Any]:
    config_file = drafter_dir / "config.json"
    if not config_file.is_file():
        raise DrafterError(f"{config_file} not found: pass a drafter directory saved with save_pretrained")
    raw = json.loads(config_file.read_text(encoding="utf-8"))
    if not isinstance(raw.get("dflash_config"), dict):
        raise DrafterError(f"{config_file} has no 'dflash_config': this is not a DFlash drafter; add "
                           "dflash_config (block_size, mask_token_id, target_layer_ids, ...) or export "
                           "the drafter with trainer.drafter")
    if not raw["dflash_config"].get("target_layer_ids"):
        raise DrafterError(f"{config_file}: dflash_config.target_layer_ids is missing; llama.cpp needs "
                           "dflash.target_layers, so write the target layer ids the drafter was trained on")
    try:  # the converter reads the config through transformers (defaults included), else the raw JSON
        from transformers import AutoConfig
        hparams = AutoConfig.from_pretrained(drafter_dir, trust_remote_code=False).to_dict()
    except Exception:
        hparams = raw
    hparams = {**hparams, **(hparams.get("text_config") or {})}
    if hparams.get("rope_is_neox_style", True) is False:
        raise DrafterError(f"{config_file}: rope_is_neox_style=false is not the reference DFlash layout")
    return hparams


def _check_target(target_dir: Path) -> tuple[dict[str, Any], str]:
    if not target_dir.is_dir():
        raise TargetError(f"target directory {target_dir} does not exist: pass the HF directory of the "
                          "target model the drafter was trained for (its tokenizer goes into the GGUF)")
    config_file = target_dir / "config.json"
    if not config_file.is_file():
        raise TargetError(f"{config_file} not found: the target directory must be a saved HF model")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    archs = (config.get("text_config") or {}).get("architectures") or config.get("architectures") or [None]
    arch = archs[0]
    sentencepiece = (target_dir / "tokenizer.model").is_file()
    if not (target_dir / "tokenizer.json").is_file() and not (sentencepiece and arch in SENTENCEPIECE_FAMILY):
        found = "only tokenizer.model (SentencePiece)" if sentencepiece else "none"
        raise TargetError(f"{target_dir / 'tokenizer.json'} not found (tokenizer files: {found}): save the "
                          "target's tokenizer there with tokenizer.save_pretrained(target_dir)")
    if arch not in LLAMA_FAMILY | BPE_FAMILY | GEMMA4_FAMILY:
        raise TargetError(f"{config_file}: GGUF vocabulary export supports {sorted(LLAMA_FAMILY | BPE_FAMILY)} "
                          f"targets, not {arch!r}; convert this drafter with llama.cpp's convert_hf_to_gguf.py")
    return {**config, **(config.get("text_config") or {})}, arch


def _safetensors_in_file_order(drafter_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors in the order of the safetensors headers, which is the order the converter writes."""
    index = drafter_dir / "model.safetensors.index.json"
    if index.is_file():
        parts = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        parts = sorted(p.name for p in drafter_dir.iterdir()
                       if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        raise DrafterError(f"no model*.safetensors in {drafter_dir}: save the drafter with safetensors")
    for part in parts:
        with open(drafter_dir / part, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            names = [k for k in json.loads(f.read(header_len)) if k != "__metadata__"]
        with safe_open(drafter_dir / part, framework="pt") as tensors:
            for name in names:
                yield name, tensors.get_tensor(name)


def _converted_tensors(drafter_dir: Path, dtype: GGUFDtype) -> Iterator[tuple[str, np.ndarray, Any]]:
    for name, tensor in _safetensors_in_file_order(drafter_dir):
        gguf_name = reference_to_gguf_name(name)
        if gguf_name is None:
            continue
        if tensor.dtype not in (torch.float16, torch.float32):
            tensor = tensor.to(torch.float32)  # bf16 and friends: exact in f32, as the converter does
        data = tensor.numpy()
        qtype = storage_type(gguf_name, data.ndim, dtype)
        try:
            quantized = gguf.quants.quantize(data, qtype)
        except gguf.QuantError:  # Q8_0 needs rows that are a multiple of 32; llama.cpp uses F16 then
            qtype = gguf.GGMLQuantizationType.F16
            quantized = gguf.quants.quantize(data, qtype)
        yield gguf_name, quantized, qtype


def _general_metadata(writer: gguf.GGUFWriter, drafter_dir: Path) -> None:
    total, shared, expert, expert_count = writer.get_total_parameter_count()
    meta = gguf.Metadata.load(None, drafter_dir, None, total)
    generation = gguf.Metadata.load_generation_config(drafter_dir)
    if generation:  # gguf 0.19 on PyPI misses this fallback that llama.cpp's converter has
        meta.sampling_penalty_repeat = generation.get(
            "penalty_repeat", generation.get("repetition_penalty", meta.sampling_penalty_repeat))
    if meta.name is None:
        meta.name = drafter_dir.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, expert_count)
    meta.set_gguf_meta_model(writer)


def _model_parameters(kv: OrderedMetadata, hp: dict[str, Any], dtype: GGUFDtype) -> None:
    """The generic text-model keys llama.cpp writes for a Qwen3-shaped drafter."""
    n_ctx = next((hp[k] for k in ("max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                  "max_sequence_length", "model_max_length") if k in hp), None)
    kv.arch("block_count", hp["num_hidden_layers"], V.UINT32)
    if n_ctx is not None:
        kv.arch("context_length", n_ctx, V.UINT32)
    kv.arch("embedding_length", hp["hidden_size"], V.UINT32)
    kv.arch("feed_forward_length", hp["intermediate_size"], V.UINT32)
    kv.arch("attention.head_count", hp["num_attention_heads"], V.UINT32)
    if (n_head_kv := hp.get("num_key_value_heads")) is not None:
        kv.arch("attention.head_count_kv", n_head_kv, V.UINT32)
    if hp.get("is_causal") is False:
        kv.arch("attention.causal", False, V.BOOL)
    _rope_parameters(kv, _rope_config(hp))
    if (eps := hp.get("rms_norm_eps", hp.get("norm_eps"))) is not None:
        kv.arch("attention.layer_norm_rms_epsilon", float(eps), V.FLOAT32)
    if (head_dim := hp.get("head_dim")) is not None:
        kv.arch("attention.key_length", head_dim, V.UINT32)
        kv.arch("attention.value_length", head_dim, V.UINT32)
    kv.set("general.file_type", int(_FILE_TYPES[dtype]), V.UINT32)


def _rope_config(hp: dict[str, Any]) -> dict[str, Any]:
    """rope_parameters (transformers 5) or rope_scaling, completed from top-level keys of older configs."""
    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" in rope or "sliding_attention" in rope:
        return rope
    for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
        if key not in rope and hp.get(key) is not None:
            rope[key] = hp[key]
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    return rope


def _rope_parameters(kv: OrderedMetadata, rope: dict[str, Any]) -> None:
    main = rope.get("full_attention", rope)
    rope_type, factor = main.get("rope_type"), main.get("factor")
    if rope_type in ("linear", "yarn") and factor is not None:
        kv.arch("rope.scaling.type", rope_type, V.STRING)
        kv.arch("rope.scaling.factor", float(factor), V.FLOAT32)
    if rope_type == "yarn" and factor is not None:
        kv.arch("rope.scaling.original_context_length", main["original_max_position_embeddings"], V.UINT32)
        for key, names in (("yarn_ext_factor", ("extrapolation_factor",)),
                           ("yarn_attn_factor", ("attention_factor", "attn_factor")),
                           ("yarn_beta_fast", ("beta_fast",)), ("yarn_beta_slow", ("beta_slow",))):
            if (value := next((main[n] for n in names if n in main), None)) is not None:
                kv.arch(f"rope.scaling.{key}", float(value), V.FLOAT32)
    elif rope_type in ("su", "longrope"):
        kv.arch("rope.scaling.type", "longrope", V.STRING)
    if "mrope_section" in rope:
        kv.arch("rope.dimension_sections", (list(rope["mrope_section"]) + [0, 0, 0, 0])[:4], V.ARRAY)
    if (theta := main.get("rope_theta")) is not None:
        kv.arch("rope.freq_base", float(theta), V.FLOAT32)
    if (theta_swa := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
        kv.arch("rope.freq_base_swa", float(theta_swa), V.FLOAT32)


def _dflash_parameters(kv: OrderedMetadata, hp: dict[str, Any], target_config: dict[str, Any]) -> None:
    """The DFlash keys, in the order llama.cpp's DFlashModel.set_gguf_parameters writes them."""
    dc = hp["dflash_config"]
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    if (partial := _rope_config(hp).get("partial_rotary_factor")) is not None:
        kv.arch("rope.dimension_count", int(head_dim * partial), V.UINT32)
    if (value_scale := dc.get("attention_value_scale")) is not None:
        kv.arch("attention.value_scale", float(value_scale), V.FLOAT32)
    kv.arch("block_size", dc.get("block_size", hp.get("block_size", 16)), V.UINT32)
    if "conv_kernel_size" in dc:  # DFlash 2
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            kv.arch(key, int(dc[key]), V.UINT32)
    if (multiplier := dc.get("output_multiplier", hp.get("output_multiplier"))) is not None:
        kv.arch("logit_scale", float(multiplier), V.FLOAT32)
    softcap = dc.get("final_logit_softcapping", hp.get("final_logit_softcapping"))
    if softcap is not None and float(softcap) > 0:
        kv.arch("final_logit_softcapping", float(softcap), V.FLOAT32)
    if (embedding_scale := dc.get("input_embedding_scale", hp.get("input_embedding_scale"))) is not None:
        kv.arch("embedding_scale", float(embedding_scale), V.FLOAT32)
    # llama.cpp counts the embedding output as layer 0, so HF hidden_states[id + 1] is its layer id + 1
    kv.arch("target_layers", [int(i) + 1 for i in dc["target_layer_ids"]], V.ARRAY)
    window = dc.get("swa_window_size") or hp.get("sliding_window")
    if (hp.get("use_sliding_window", False) or dc.get("use_swa", False)) and window:
        pattern = ([True] * hp["num_hidden_layers"] if dc.get("use_swa", False)
                   else [t == "sliding_attention" for t in hp.get("layer_types") or []])
        kv.arch("attention.sliding_window", window, V.UINT32)
        kv.arch("attention.sliding_window_pattern", pattern, V.ARRAY)
    causal = hp.get("is_causal")
    if causal is None:
        causal = dc.get("causal")
    if causal is not None:
        kv.arch("attention.causal", bool(causal), V.BOOL)
    target_rope = target_config.get("rope_parameters") or target_config.get("rope_scaling") or {}
    if "mrope_section" in target_rope:  # the drafter ropes on the temporal section only
        kv.arch("rope.dimension_sections", [head_dim // 2, 0, 0, 0], V.ARRAY)
