"""Targets handed over as PEFT LoRA adapters: a folder with adapter_config.json and adapter_model.safetensors over
a base model folder. Checked without loading; loaded by merging the adapter into its base (peft's own
`merge_and_unload`), so everything downstream sees one plain causal LM.

The base is the one the job names (`target.base`, `draftsmith run --base DIR`), always. The adapter's own
`base_model_name_or_path` is a string in a file the organisation wrote: it is never opened here, whatever it names
(another organisation's cached model, a folder outside the allowed roots, `/etc`). `draftsmith run` on one's own
machine reads it as a suggestion for `--base` (`suggested_base`), before the job is built; the service refuses an
adapter without `target.base` before it looks anything up.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from schemas.job_spec import ADAPTER_CONFIG
from schemas.manifest import sha256_file
from trainer.errors import TargetBaseRequired, TargetError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
MAX_ADAPTER_CONFIG_BYTES = 1 << 20
SUPPORTED_PEFT_TYPES = ("LORA",)
BASE_HINT = ("set target.base (draftsmith run --base DIR) to the folder or URI of the base model the adapter was "
             "trained on")


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def require_base(path: Path, base: object | None) -> None:
    """Refuse an adapter folder given without its base, naming the field. The message is the same whatever the
    adapter's config names, and nothing it names is looked up."""
    if base is None and is_adapter_dir(path):
        raise TargetBaseRequired(f"the target is a LoRA adapter and the job names no base model: {BASE_HINT} (the "
                                 "base_model_name_or_path written in adapter_config.json is never opened)")


def model_and_adapter(path: str | Path, *, allow_pickle: bool = False,
                      base: str | Path | None = None) -> tuple[Path, Path | None]:
    """(the folder holding the full model, the adapter folder or None). An adapter folder is checked here (its
    weights, its kind) and needs `base`; the base folder itself is checked by the caller like any target."""
    path = Path(path)
    if not is_adapter_dir(path):
        if base is not None:
            raise TargetError(f"target {path}: a base model ({base}) was given but the target is not a LoRA adapter "
                              f"folder ({ADAPTER_CONFIG} is missing); drop target.base or point the target at the "
                              "adapter")
        return path, None
    require_base(path, base)
    inspect_adapter_dir(path, allow_pickle=allow_pickle)
    return Path(base), path  # type: ignore[arg-type]  # require_base refused None


def suggested_base(path: str | Path) -> str | None:
    """For `draftsmith run` on one's own machine only: the local folder an adapter's config names as its base, if
    that folder exists here (the user's own files, the user's own choice). Never called by the service."""
    path = Path(path)
    if not is_adapter_dir(path):
        return None
    named = read_adapter_config(path).get("base_model_name_or_path")
    return named if isinstance(named, str) and named and Path(named).is_dir() else None


def read_adapter_config(path: Path) -> dict:
    file = path / ADAPTER_CONFIG
    if file.stat().st_size > MAX_ADAPTER_CONFIG_BYTES:
        raise TargetError(f"target {ADAPTER_CONFIG} is {file.stat().st_size:,} bytes, more than any adapter's "
                          "config; hand over the adapter's own config")
    try:
        config = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TargetError(f"target {ADAPTER_CONFIG} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise TargetError(f"target {ADAPTER_CONFIG} must hold a JSON object")
    return config


def inspect_adapter_dir(path: Path, *, allow_pickle: bool = False) -> dict:
    """Check an adapter folder without loading it; return its adapter_config.json. Raises TargetError in one line."""
    config = read_adapter_config(path)
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
