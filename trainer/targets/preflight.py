"""A target folder judged by what its files hold before anything is allocated for it.

An organisation's checkpoint is hostile until checked: a size written in config.json or in a safetensors header is
data to compare, never an amount to allocate. `preflight(path, limits)` runs before `from_pretrained` and refuses,
in seconds and with a few kilobytes read per file:

1. config.json's sizes (layers, hidden width, vocabulary, context, experts) that are not positive integers or that
   exceed the deployment's limits (schemas/bounds.py `TargetLimits`);
2. a weight file that is not a well-formed safetensors file: a header larger than any honest one (a header bomb),
   data shorter than its header promises (a truncated shard), a dtype safetensors does not define or a size that
   does not match it, the same tensor twice (within a file or across shards), an index that names tensors its
   shards do not hold;
3. a checkpoint whose parameter count exceeds the limit, or that does not match the model config.json describes:
   that model is built on the meta device (no memory) and its tensors compared with the headers'.

Each refusal is a TargetError subclass with its own code (trainer/errors.py), naming the file, the field and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from schemas.bounds import TargetLimits
from trainer.errors import (
    TargetConfigInvalid,
    TargetError,
    TargetShapeMismatch,
    TargetTooLarge,
    WeightsDtypeInvalid,
    WeightsHeaderInvalid,
    WeightsShardTruncated,
    WeightsTensorDuplicate,
)

MAX_HEADER_BYTES = 32 << 20
"""The largest safetensors header read: a 1,000-tensor shard's header is about 100 KB; the format's own reader
stops at 100 MB, which an attacker could make us allocate for every shard."""
MAX_CONFIG_BYTES = 4 << 20
"""config.json larger than this is not a model's config."""

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
"""Every dtype safetensors defines with a whole number of bytes per element."""
FLOAT_DTYPES = frozenset({"F8_E5M2", "F8_E4M3", "F16", "BF16", "F32", "F64"})

# config.json fields that size an allocation, and the TargetLimits field each is held to.
SIZE_FIELDS = {
    "num_hidden_layers": "max_layers", "hidden_size": "max_hidden_size", "intermediate_size": "max_hidden_size",
    "moe_intermediate_size": "max_hidden_size", "vocab_size": "max_vocab_size",
    "max_position_embeddings": "max_context", "num_attention_heads": "max_heads", "num_key_value_heads": "max_heads",
    "head_dim": "max_hidden_size", "num_experts": "max_experts", "num_local_experts": "max_experts",
    "n_routed_experts": "max_experts",
}


@dataclass(frozen=True)
class TensorEntry:
    file: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def preflight(path: Path, config: dict, limits: TargetLimits, weight_files: list[Path],
              weight_map: dict[str, str] | None = None) -> dict[str, TensorEntry]:
    """Judge a target folder's config and safetensors headers (and its index's `weight_map`, if sharded) against
    each other and `limits`; return the checkpoint's tensors by name. Reads each header, nothing else."""
    check_config_sizes(config, limits)
    tensors = read_checkpoint_tensors(weight_files, weight_map)
    total = sum(entry.numel for entry in tensors.values())
    if total > limits.max_parameters:
        raise TargetTooLarge(f"target: its safetensors files hold {total:,} parameters, more than this deployment "
                             f"loads ({limits.max_parameters:,}, DRAFTSMITH_TARGET_MAX_PARAMETERS); use a smaller "
                             "target or ask the operator to raise the limit")
    check_against_config(path, config, tensors, total, limits)
    return tensors


def text_config(config: dict) -> dict:
    """The decoder's own config: multimodal wrappers nest it as `text_config`."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def check_config_sizes(config: dict, limits: TargetLimits) -> None:
    nested = text_config(config)
    for scope in (config,) if nested is config else (config, nested):
        for name, limit_name in SIZE_FIELDS.items():
            if name not in scope or scope[name] is None:
                continue
            value, limit = scope[name], getattr(limits, limit_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TargetConfigInvalid(f"target config.json: {name} is {value!r}; it must be a positive integer "
                                          "(fix config.json: it describes the model the weights belong to)")
            if value > limit:
                raise TargetTooLarge(f"target config.json: {name} is {value:,}, above this deployment's limit of "
                                     f"{limit:,} (DRAFTSMITH_TARGET_{limit_name.upper()}); use a smaller target or "
                                     "ask the operator to raise the limit")


def read_config(path: Path) -> dict:
    """config.json, refused when it is not a small JSON object."""
    return read_config_file(path / "config.json", TargetConfigInvalid)


def read_config_file(file: Path, error: type[TargetError]) -> dict:
    """A small JSON object from one of the folder's config files, else `error` naming the file."""
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise error(f"target {file.name} is {file.stat().st_size:,} bytes, more than any model config "
                    f"({MAX_CONFIG_BYTES:,}); hand over the model's own {file.name}")
    try:
        config = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"target {file.name} is not valid JSON ({type(exc).__name__}); hand over the model's own "
                    f"{file.name}") from None
    if not isinstance(config, dict):
        raise error(f"target {file.name} must hold a JSON object; hand over the model's own {file.name}")
    return config


def _no_duplicates(file: str):
    def pairs(items: list[tuple[str, object]]) -> dict:
        seen: dict[str, object] = {}
        for key, value in items:
            if key in seen:
                raise WeightsTensorDuplicate(f"target {file}: its header lists {key!r} twice; save the weights "
                                             "again (save_pretrained(..., safe_serialization=True))")
            seen[key] = value
        return seen
    return pairs


def read_header(file: Path) -> dict[str, TensorEntry]:
    """One safetensors file's tensors, from its header alone, after checking that the file holds every byte the
    header promises."""
    name, size = file.name, file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise WeightsShardTruncated(f"target {name}: {size} bytes, too short for a safetensors file; copy the "
                                        "file again")
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_BYTES:
            raise WeightsHeaderInvalid(f"target {name}: its safetensors header claims {length:,} bytes, more than "
                                       f"any checkpoint's ({MAX_HEADER_BYTES:,}); the file is not a model's weights")
        if length > size - 8:
            raise WeightsShardTruncated(f"target {name}: its header claims {length:,} bytes but the file has "
                                        f"{size - 8:,} after the length; the file is truncated: copy it again")
        raw = handle.read(length)
    try:
        header = json.loads(raw, object_pairs_hook=_no_duplicates(name))
    except WeightsTensorDuplicate:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise WeightsHeaderInvalid(f"target {name}: its safetensors header is not valid JSON "
                                   f"({type(exc).__name__}); the file is not a model's weights") from None
    if not isinstance(header, dict):
        raise WeightsHeaderInvalid(f"target {name}: its safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    entries = {}
    for key, value in header.items():
        if key == "__metadata__":
            continue
        entries[key] = _entry(name, key, value, data_bytes)
    return entries


def _entry(name: str, key: str, value: object, data_bytes: int) -> TensorEntry:
    if not isinstance(value, dict):
        raise WeightsHeaderInvalid(f"target {name}: header entry {key!r} is not an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise WeightsDtypeInvalid(f"target {name}: tensor {key!r} has dtype {dtype!r}, which is not a safetensors "
                                  f"dtype ({', '.join(DTYPE_BYTES)}); save the weights again")
    if not (isinstance(shape, list) and len(shape) <= 8
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise WeightsHeaderInvalid(f"target {name}: tensor {key!r} has shape {shape!r}; a shape is a list of at "
                                   "most 8 non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise WeightsHeaderInvalid(f"target {name}: tensor {key!r} has data_offsets {offsets!r}; expected "
                                   "[begin, end] with 0 <= begin <= end")
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise WeightsDtypeInvalid(f"target {name}: tensor {key!r} ({dtype}, shape {shape}) needs {expected:,} bytes "
                                  f"but its header gives it {offsets[1] - offsets[0]:,}; save the weights again")
    if offsets[1] > data_bytes:
        raise WeightsShardTruncated(f"target {name}: tensor {key!r} ends at byte {offsets[1]:,} of the data but the "
                                    f"file holds {data_bytes:,}; the file is truncated: copy it again")
    return TensorEntry(name, dtype, tuple(shape))


INDEX_FILE = "model.safetensors.index.json"


def read_weight_map(path: Path) -> dict[str, str] | None:
    """A sharded checkpoint's index (tensor name -> shard file), None without one. A shard is a bare file name in
    the folder: a path in the index is data, never a location to open."""
    index = path / INDEX_FILE
    if not index.is_file():
        return None
    weight_map = read_config_file(index, WeightsHeaderInvalid).get("weight_map", {})
    if not isinstance(weight_map, dict):
        raise WeightsHeaderInvalid(f"target {INDEX_FILE}: weight_map is not an object; save the weights again")
    for shard in weight_map.values():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise WeightsHeaderInvalid(f"target {INDEX_FILE} names {shard!r} as a shard; shards are file names in "
                                       "the model folder: save the weights again")
    return weight_map


def read_checkpoint_tensors(weight_files: list[Path], weight_map: dict[str, str] | None) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint by name, across its shards; an index must name exactly what they hold."""
    tensors: dict[str, TensorEntry] = {}
    for file in weight_files:
        for key, entry in read_header(file).items():
            if key in tensors:
                raise WeightsTensorDuplicate(f"target: tensor {key!r} is in both {tensors[key].file} and {file.name}; "
                                             "keep one copy (save the weights again)")
            tensors[key] = entry
    for key, shard in (weight_map or {}).items():
        if key not in tensors or tensors[key].file != shard:
            raise TargetShapeMismatch(f"target {INDEX_FILE}: {key!r} is listed in {shard!r}, which does not hold it; "
                                      "save the weights again")
    return tensors


def meta_model(config_path: Path):
    """The model config.json describes, built on the meta device: shapes without memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(config_path, trust_remote_code=False)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # transformers' own checks of the config
        raise TargetConfigInvalid(f"target config.json does not describe a model transformers can build "
                                  f"({type(exc).__name__}: {str(exc)[:300]}); hand over the config.json these "
                                  "weights were saved with") from None


def check_against_config(path: Path, config: dict, tensors: dict[str, TensorEntry], total: int,
                         limits: TargetLimits) -> None:
    """The checkpoint's tensors against the model its config.json describes: same shapes where names agree, and
    the same number of parameters (a tied LM head may be stored or not; families whose loader fuses per-expert
    tensors change names, never counts)."""
    model = meta_model(path)
    expected = sum(p.numel() for p in model.parameters())
    if expected > limits.max_parameters:
        raise TargetTooLarge(f"target config.json describes a model of {expected:,} parameters, more than this "
                             f"deployment loads ({limits.max_parameters:,}, DRAFTSMITH_TARGET_MAX_PARAMETERS)")
    own = dict(model.named_parameters(remove_duplicate=False))
    for key, entry in tensors.items():
        parameter = own.get(key)
        if parameter is None:
            continue
        if tuple(parameter.shape) != entry.shape:
            raise TargetShapeMismatch(f"target: tensor {key!r} has shape {list(entry.shape)} in {entry.file} but "
                                      f"config.json's model needs {list(parameter.shape)}; hand over the config.json "
                                      "these weights were saved with")
        if parameter.is_floating_point() and entry.dtype not in FLOAT_DTYPES:
            raise WeightsDtypeInvalid(f"target: tensor {key!r} is stored as {entry.dtype} in {entry.file}, but it is "
                                      "a floating-point weight; save the weights again in their floating-point dtype")
    head = model.get_output_embeddings()
    tied_extra = head.weight.numel() if head is not None and _tied(model) else 0
    # Persistent buffers (a per-layer scalar, say) are saved beside the parameters; rotary tables are not.
    buffers = sum(t.numel() for k, t in model.state_dict().items() if k not in own)
    if total not in {expected, expected + tied_extra, expected + buffers, expected + tied_extra + buffers}:
        raise TargetShapeMismatch(f"target: its safetensors files hold {total:,} parameters but config.json "
                                  f"describes a model of {expected:,}; hand over the config.json these weights were "
                                  "saved with")


def _tied(model) -> bool:
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embedding is not None and head.weight is embedding.weight
