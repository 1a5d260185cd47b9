"""The exported drafter folders, one per way engines read a draft vocabulary.

    drafter/       the reference `dflash` format (SGLang, transformers + the `dflash` package, vLLM for DFlash 2):
                   config.json + model.safetensors, the full head borrowed from the target, nothing else. An
                   engine that loads every `*.safetensors` of a folder (vLLM does) finds exactly the weights.
    drafter-d2t/   only for a drafter with a draft vocabulary: the same weights plus `d2t` (int64 offsets,
                   target id = draft id + d2t) and `lm_head.weight` (the target head's rows at the draft ids)
                   in its one model.safetensors, and `draft_vocab_size` as a top-level config key. That is what
                   vLLM's DFlash loader reads (qwen3_dflash.py creates `draft_id_to_target_id` only when the
                   config has that key; its `load_weights` maps `d2t` onto it and skips `t2d`), and what
                   llama.cpp's own converter turns into a `d2t` GGUF (conversion/qwen.py, DFlashModel). Our
                   `load_drafter` reads it too (trainer/drafter/checkpoint.py), drafting over the same tokens.

vLLM's DFlash 2 candidate head (qwen3_dflash2.py `compute_candidates`, V2 runner only) takes the top-k of the
drafter's own `lm_head` without the `d2t` map, so a DFlash 2 drafter is served by vLLM from `drafter/`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainer.atomic import atomic_path, atomic_write_json
from trainer.drafter.checkpoint import d2t_tensors

REFERENCE_DIR = "drafter"
D2T_DIR = "drafter-d2t"


def reference_config(drafter_config: dict) -> dict:
    """config.json of `drafter/`: the reference format names no draft vocabulary (the folder has none)."""
    config = json.loads(json.dumps(drafter_config))
    config.pop("draft_vocab_size", None)
    ours = config.get("draftsmith") or {}
    ours.pop("draft_vocab_size", None)
    if ours:
        config["draftsmith"] = ours
    else:
        config.pop("draftsmith", None)
    return config


def write_d2t_drafter(config: dict, weights: Path, out_dir: Path, draft_ids: torch.Tensor,
                      target_head: torch.Tensor) -> Path:
    """Write `drafter-d2t/`: `config` (the trained drafter's config.json, which names the draft vocabulary) with
    `draft_vocab_size` at the top, and the weights of `weights` plus `d2t` and the head rows; return the folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(weights))
    tensors.update(d2t_tensors(draft_ids, target_head, next(iter(tensors.values())).dtype))
    config = {**config, "draft_vocab_size": len(draft_ids)}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    atomic_write_json(out_dir / "config.json", config)
    return out_dir
