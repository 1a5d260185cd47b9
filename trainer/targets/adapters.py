"""Targets handed over as PEFT LoRA adapters: a folder with adapter_config.json and adapter_model.safetensors over
a base model folder. Checked without loading; loaded by merging the adapter into its base (peft's own
`merge_and_unload`), so everything downstream sees one plain causal LM.

The base is the job's `target.base` (`--base DIR`), else the adapter's `base_model_name_or_path` when that names a
local folder. A Hub id there is never fetched here: the worker resolves a job's URIs (the same rules as the target's
own) and hands over folders.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from schemas.manifest import sha256_file
from trainer.errors import TargetError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
SUPPORTED_PEFT_TYPES = ("LORA",)
BASE_HINT = ("set target.base (draftsmith run --base DIR) to the folder or URI of the base model the adapter was "
             "trained on")


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def model_and_adapter(path: str | Path, *, allow_pickle: bool = False,
                      base: str | Path | None = None) -> tuple[Path, Path | None]:
    """(the folder holding the full model, the adapter folder or None). An adapter folder is checked here (its
    weights, its kind) and its base resolved; the base folder itself is checked by the caller like any target."""
    path = Path(path)
    if not is_adapter_dir(path):
        if base is not None:
            raise TargetError(f"target {path}: a base model ({base}) was given but the target is not a LoRA adapter "
                              f"folder ({ADAPTER_CONFIG} is missing); drop target.base or point the target at the "
                              "adapter")
        return path, None
    config = inspect_adapter_dir(path, allow_pickle=allow_pickle)
    if base is not None:
        return Path(base), path
    named = config.get("base_model_name_or_path")
    if named and Path(named).is_dir():
        return Path(named), path
    where = f"its base_model_name_or_path {named!r} is not a local folder" if named else "it names no base model"
    raise TargetError(f"target {path}: a LoRA adapter needs its base model and {where} (nothing is downloaded "
                      f"here); {BASE_HINT}")


def inspect_adapter_dir(path: Path, *, allow_pickle: bool = False) -> dict:
    """Check an adapter folder without loading it; return its adapter_config.json. Raises TargetError in one line."""
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except json.JSONDecodeError as exc:
        raise TargetError(f"target {path}: {ADAPTER_CONFIG} is not valid JSON ({exc})") from exc
    peft_type = str(config.get("peft_type") or "unknown")
    if peft_type.upper() not in SUPPORTED_PEFT_TYPES:
        raise TargetError(f"target {path}: PEFT adapter type {peft_type!r} is not supported; supported: "
                          f"{', '.join(SUPPORTED_PEFT_TYPES)} (merge the adapter into its base and hand over the "
                          "merged model instead)")
    if (path / ADAPTER_WEIGHTS).is_file():
        return config
    if not (path / ADAPTER_PICKLE).is_file():
        raise TargetError(f"target {path}: no adapter weights found; expected {ADAPTER_WEIGHTS}")
    if not allow_pickle:
        raise TargetError(f"target {path}: only pickle weights ({ADAPTER_PICKLE}) were found; convert them to "
                          "safetensors (save_pretrained(..., safe_serialization=True)) or set allow_pickle on the job")
    return config


def merge_adapter(model, adapter_dir: Path):
    """The base `model` with the adapter merged into its weights, in the base's dtype (peft computes each update
    and casts it to the weight it is added to). The adapter itself is plain tensors: no code of it runs."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter_dir, is_trainable=False).merge_and_unload()


# Where the base was found when the adapter was saved: a path on someone's machine, not part of what the adapter
# does (the base's own identity is the tokenizer and embedding table the fingerprint already covers).
_WHERE_KEYS = ("base_model_name_or_path", "revision")


def adapter_digest(adapter_dir: Path) -> bytes:
    """What identifies an adapter: the sha256 of its config (less where its base lay) and of its weights file (the
    one loaded)."""
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    digest = hashlib.sha256(json.dumps({k: v for k, v in config.items() if k not in _WHERE_KEYS},
                                       sort_keys=True).encode())
    weights = adapter_dir / ADAPTER_WEIGHTS
    digest.update(bytes.fromhex(sha256_file(weights if weights.is_file() else adapter_dir / ADAPTER_PICKLE)))
    return digest.digest()
