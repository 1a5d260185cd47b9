"""Export a reference-format DFlash / DFlash 2 drafter to a GGUF file for llama.cpp.

The output is meant to be indistinguishable from what llama.cpp's own converter
(`convert_hf_to_gguf.py DRAFTER --target-model-dir TARGET`, class `DFlashModel`) writes: the same
metadata keys, values and order, the same tensor names, and the same per-tensor storage type
(norms, 1-D tensors and the conv base kernels stay F32; every other `.weight` becomes F16 or
Q8_0, Q8_0 falling back to F16 where a row is not a multiple of 32). A drafter has no embedding
or LM head of its own, so only the target's tokenizer is read from the target directory.

Scope of the vocabulary export: byte-level BPE tokenizers (`tokenizer.json`, the `gpt2` model
in llama.cpp terms) of Llama-, Mistral- and Qwen-family targets. SentencePiece targets are
refused with an error that names llama.cpp's converter as the way out.
"""

from __future__ import annotations

import json
import os
import re
import struct
from hashlib import sha256
from pathlib import Path
from typing import Any, Iterator, Literal

import gguf
import numpy as np
import torch
from safetensors import safe_open

from trainer.errors import DrafterError, TargetError

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

# llama.cpp names a BPE pre-tokenizer by hashing the token ids its tokenizer gives for this probe
# text (convert_hf_to_gguf_update.py); the text must stay byte-identical for the hashes to match.
PRE_TOKENIZER_PROBE = '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'  # noqa: E501
# The llama.cpp identifiers of the tokenizer families our targets use (hash -> tokenizer.ggml.pre).
KNOWN_PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3.x
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen 1.5-2.5, 3
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3 (embedding)
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4": "qwen35",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM 1/2
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral Nemo
    "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5": "deepseek-v3",
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",
}
# Target architectures whose vocabulary llama.cpp exports the Llama way (add_space_prefix from
# tokenizer_config, SmolLM's 49152-token vocab without BOS) vs. the plain BPE way.
_LLAMA_FAMILY = {"LlamaForCausalLM", "LLaMAForCausalLM", "LlamaModel", "MistralForCausalLM", "MixtralForCausalLM"}
_BPE_FAMILY = {"Qwen2ForCausalLM", "Qwen2Model", "Qwen3ForCausalLM", "Qwen3Model",
               "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
_SPECIAL_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                    "sep": "seperator_token_id", "pad": "padding_token_id", "mask": "mask_token_id",
                    "eot": "eot_token_id", "eom": "eom_token_id"}  # `seperator` is llama.cpp's spelling


def reference_to_gguf_name(name: str) -> str | None:
    """GGUF name of a reference checkpoint tensor (None for buffers llama.cpp does not need)."""
    name = name.removeprefix("model.")
    if name.endswith(_SKIPPED_SUFFIXES):
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


class _Metadata:
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
               *, tokenizer_pre: str | None = None) -> Path:
    """Write `out_path` (atomically: a temporary file in the same directory, renamed at the end).

    `tokenizer_pre` overrides the llama.cpp pre-tokenizer name for a BPE tokenizer whose probe
    hash is not in KNOWN_PRE_TOKENIZERS."""
    drafter_dir, target_dir, out_path = Path(drafter_dir), Path(target_dir), Path(out_path)
    if dtype not in _QUANT_TYPES:
        raise ValueError(f"GGUF dtype must be one of {sorted(_QUANT_TYPES)}, got {dtype!r}")
    hparams = _load_drafter_config(drafter_dir)
    target_config, target_arch = _check_target(target_dir)

    tmp_path = out_path.with_name(f".{out_path.name}.{os.getpid()}.partial")
    try:
        writer = gguf.GGUFWriter(path=None, arch=ARCH)
        for gguf_name, data, qtype in _converted_tensors(drafter_dir, dtype):
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        writer.add_type(gguf.GGUFType.MODEL)
        _general_metadata(writer, drafter_dir)
        kv = _Metadata()
        _model_parameters(kv, hparams, target_config, dtype)
        kv.set("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32)
        _vocabulary(kv, hparams, target_dir, target_arch, tokenizer_pre)
        kv.write_to(writer)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        writer.write_header_to_file(path=tmp_path)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(tmp_path, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp_path, out_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
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
    try:  # the converter reads the config through transformers, defaults included
        from transformers import AutoConfig
        hparams = AutoConfig.from_pretrained(drafter_dir, trust_remote_code=False).to_dict()
    except Exception:
        hparams = raw
    hparams = {**hparams, **hparams.get("text_config", {})}
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
    if not (target_dir / "tokenizer.json").is_file():
        found = "only tokenizer.model (SentencePiece)" if (target_dir / "tokenizer.model").is_file() else "none"
        raise TargetError(f"{target_dir / 'tokenizer.json'} not found (tokenizer files: {found}): save the "
                          "target's tokenizer there with tokenizer.save_pretrained(target_dir)")
    archs = (config.get("text_config") or {}).get("architectures") or config.get("architectures") or [None]
    arch = archs[0]
    if arch not in _LLAMA_FAMILY | _BPE_FAMILY:
        raise TargetError(f"{config_file}: GGUF vocabulary export supports {sorted(_LLAMA_FAMILY | _BPE_FAMILY)} "
                          f"targets, not {arch!r}; convert this drafter with llama.cpp's convert_hf_to_gguf.py")
    return {**config, **config.get("text_config", {})}, arch


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


def _model_parameters(kv: _Metadata, hp: dict[str, Any], target_config: dict[str, Any], dtype: GGUFDtype) -> None:
    def first(*keys: str) -> Any:
        return next((hp[k] for k in keys if k in hp), None)

    kv.arch("block_count", hp["num_hidden_layers"], V.UINT32)
    if (n_ctx := first("max_position_embeddings", "n_ctx", "n_positions", "max_length",
                       "max_sequence_length", "model_max_length")) is not None:
        kv.arch("context_length", n_ctx, V.UINT32)
    kv.arch("embedding_length", hp["hidden_size"], V.UINT32)
    kv.arch("feed_forward_length", hp["intermediate_size"], V.UINT32)
    kv.arch("attention.head_count", hp["num_attention_heads"], V.UINT32)
    if (n_head_kv := hp.get("num_key_value_heads")) is not None:
        kv.arch("attention.head_count_kv", n_head_kv, V.UINT32)
    if hp.get("is_causal") is False:
        kv.arch("attention.causal", False, V.BOOL)

    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" not in rope and "sliding_attention" not in rope:
        for key, source in (("rope_theta", "rope_theta"), ("rope_type", None),
                            ("partial_rotary_factor", "partial_rotary_factor"),
                            ("original_max_position_embeddings", "original_max_position_embeddings")):
            value = rope.get("type") if source is None else hp.get(source)
            if key not in rope and value is not None:
                rope[key] = value
    rope_main = rope.get("full_attention", rope)
    rope_type, factor = rope_main.get("rope_type"), rope_main.get("factor")
    if rope_type == "linear" and factor is not None:
        kv.arch("rope.scaling.type", "linear", V.STRING)
        kv.arch("rope.scaling.factor", float(factor), V.FLOAT32)
    elif rope_type == "yarn" and factor is not None:
        kv.arch("rope.scaling.type", "yarn", V.STRING)
        kv.arch("rope.scaling.factor", float(factor), V.FLOAT32)
        kv.arch("rope.scaling.original_context_length", rope_main["original_max_position_embeddings"], V.UINT32)
        for key, names in (("yarn_ext_factor", ("extrapolation_factor",)),
                           ("yarn_attn_factor", ("attention_factor", "attn_factor")),
                           ("yarn_beta_fast", ("beta_fast",)), ("yarn_beta_slow", ("beta_slow",))):
            if (value := next((rope_main[n] for n in names if n in rope_main), None)) is not None:
                kv.arch(f"rope.scaling.{key}", float(value), V.FLOAT32)
    elif rope_type in ("su", "longrope"):
        kv.arch("rope.scaling.type", "longrope", V.STRING)
    if "mrope_section" in rope:
        kv.arch("rope.dimension_sections", (list(rope["mrope_section"]) + [0, 0, 0, 0])[:4], V.ARRAY)
    if (theta := rope_main.get("rope_theta")) is not None:
        kv.arch("rope.freq_base", float(theta), V.FLOAT32)
    if (theta_swa := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
        kv.arch("rope.freq_base_swa", float(theta_swa), V.FLOAT32)
    if (eps := first("rms_norm_eps", "norm_eps")) is not None:
        kv.arch("attention.layer_norm_rms_epsilon", float(eps), V.FLOAT32)
    if (head_dim := hp.get("head_dim")) is not None:
        kv.arch("attention.key_length", head_dim, V.UINT32)
        kv.arch("attention.value_length", head_dim, V.UINT32)
    kv.set("general.file_type", int(_FILE_TYPES[dtype]), V.UINT32)

    # DFlash-specific keys, in the order llama.cpp's DFlashModel.set_gguf_parameters writes them.
    dc = hp["dflash_config"]
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    if (partial := rope.get("partial_rotary_factor")) is not None:
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
    # llama.cpp counts the embedding output as layer 0, HF hidden_states[id + 1] is its layer id + 1
    kv.arch("target_layers", [int(i) + 1 for i in dc["target_layer_ids"]], V.ARRAY)
    window = dc.get("swa_window_size") or hp.get("sliding_window")
    if (hp.get("use_sliding_window", False) or dc.get("use_swa", False)) and window:
        pattern = ([True] * hp["num_hidden_layers"] if dc.get("use_swa", False)
                   else [t == "sliding_attention" for t in hp.get("layer_types") or []])
        kv.arch("attention.sliding_window", window, V.UINT32)
        kv.arch("attention.sliding_window_pattern", pattern, V.ARRAY)
    causal = hp.get("is_causal")
    if (causal := dc.get("causal") if causal is None else causal) is not None:
        kv.arch("attention.causal", bool(causal), V.BOOL)
    target_rope = target_config.get("rope_parameters") or target_config.get("rope_scaling") or {}
    if "mrope_section" in target_rope:  # the drafter ropes on the temporal section only
        kv.arch("rope.dimension_sections", [head_dim // 2, 0, 0, 0], V.ARRAY)


def _vocabulary(kv: _Metadata, hp: dict[str, Any], target_dir: Path, target_arch: str,
                tokenizer_pre: str | None) -> None:
    from transformers import AutoTokenizer

    tokenizer_json = json.loads((target_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer_config = _read_json(target_dir / "tokenizer_config.json")
    model = tokenizer_json.get("model", {})
    # llama.cpp takes SentencePiece files, and byte-fallback BPE of Llama-family targets, as `llama` vocabs
    sentencepiece = (target_dir / "tokenizer.model").is_file() or (
        target_arch in _LLAMA_FAMILY and model.get("byte_fallback", False)
        and (tokenizer_json.get("decoder") or {}).get("type") == "Sequence")
    if sentencepiece or model.get("type") != "BPE":
        kind = "SentencePiece-style" if sentencepiece else f"{model.get('type')!r}"
        raise TargetError(f"{target_dir}: the target's tokenizer is {kind}, not byte-level BPE, which is all "
                          "this exporter writes; convert the drafter with llama.cpp's convert_hf_to_gguf.py")
    if target_arch in _LLAMA_FAMILY and tokenizer_config.get("add_prefix_space") is not None:
        kv.set("tokenizer.ggml.add_space_prefix", bool(tokenizer_config["add_prefix_space"]), V.BOOL)

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    vocab_size = hp.get("vocab_size", len(tokenizer.vocab))
    if max(tokenizer.vocab.values()) >= vocab_size:
        raise DrafterError(f"the target tokenizer has ids up to {max(tokenizer.vocab.values())} but the "
                           f"drafter's vocab_size is {vocab_size}: the drafter was not made for this target")
    probe_hash = sha256(str(tokenizer.encode(PRE_TOKENIZER_PROBE)).encode()).hexdigest()
    pre = tokenizer_pre or KNOWN_PRE_TOKENIZERS.get(probe_hash)
    if pre is None:
        raise TargetError(f"{target_dir}: BPE pre-tokenizer with probe hash {probe_hash} is unknown; pass "
                          "tokenizer_pre= with the name llama.cpp's convert_hf_to_gguf.py gives this hash")
    tokens, token_types = _token_table(tokenizer, vocab_size)
    kv.set("tokenizer.ggml.model", "gpt2", V.STRING)
    kv.set("tokenizer.ggml.pre", pre, V.STRING)
    kv.set("tokenizer.ggml.tokens", tokens, V.ARRAY)
    kv.set("tokenizer.ggml.token_type", token_types, V.ARRAY)
    _special_vocabulary(kv, target_dir, tokenizer_json, tokenizer_config)
    if target_arch in _LLAMA_FAMILY and hp.get("vocab_size", 32000) == 49152:
        kv.set("tokenizer.ggml.add_bos_token", False, V.BOOL)  # llama.cpp's rule for SmolLM/Granite vocabs
    if (mask_id := hp["dflash_config"].get("mask_token_id")) is not None:
        kv.set("tokenizer.ggml.mask_token_id", int(mask_id), V.UINT32)


def _token_table(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int]]:
    by_id = {i: token for token, i in tokenizer.vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = by_id[i]
        if token not in added:
            types.append(gguf.TokenType.NORMAL)
        else:
            if not decoder[i].normalized:  # llama.cpp expects added tokens in normalized form
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        tokens.append(token)
    return tokens, [int(t) for t in types]


def _looks_special(token: str) -> bool:
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
