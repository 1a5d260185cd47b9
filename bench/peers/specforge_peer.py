"""SpecForge 0.2.0 (PyPI `specforge`) as a peer trainer for bench/peers/compare.py: our regenerated data in its offline
format, its DFlash run config, `specforge train` and `specforge export --to hf`.

SpecForge lives in its own venv (`bash bench/setup/specforge.sh`, default `.engines/specforge`): a bench
dependency, never a runtime one. It trains on this CPU without source changes: `SPECFORGE_DEVICE=cpu`,
`fsdp_sharding: NO_SHARD` and `attention_backend: sdpa` (its default, flex_attention, needs torch.compile).

Its offline format is one `torch.save` file per sample with `input_ids [L]`, `loss_mask [L]` (1 on the
tokens to supervise) and `hidden_states [L, taps*H]`, HF `hidden_states[id + 1]` of each tapped layer
concatenated: our convention, so our shards convert row for row. Our shards keep the taps of every token but
the last (the last regenerated token never went through the target); that row is zero here, which changes
nothing: a block only sees context strictly before its anchor, and the last token is never an anchor.

The drafter's shape comes from our DrafterConfig (an explicit draft config: SpecForge's
`model.draft_num_hidden_layers` override re-derives the taps, to [1, 27] for 2 layers on this target).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from bench.peers.peer_run import finished_conversion, tap_conversion_identity

DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".engines" / "specforge"
INSTALL = "bash bench/setup/specforge.sh"

# SpecForge's published DFlash recipe (its repository's examples/configs, e.g. qwen3-8b-dflash-perfectblend and
# qwen3.5-4b-dflash-offline: lr 6e-4, warm-up ratio 0.04, grad-norm clip 1.0, decay gamma 7, bfloat16 weights
# with float32 Adam masters) and the defaults it leaves in place (AdamW betas 0.9/0.999, weight decay 0,
# cosine to 0, seed 42). Used wherever it differs from ours; what is aligned is set by bench/peers/compare.py.
PUBLISHED_RECIPE = {
    "learning_rate": 6.0e-4,
    "warmup_ratio": 0.04,
    "max_grad_norm": 1.0,
    "loss_decay_gamma": 7.0,
    "lr_scheduler": "cosine",
    "seed": 42,
}
PUBLISHED_DTYPE = "bfloat16"


def specforge_bin(venv: Path) -> Path:
    exe = venv / "bin" / "specforge"
    if not exe.is_file():
        raise SystemExit(f"SpecForge is not installed in {venv}. Install it (its own venv, ~1 GB, torch CPU "
                         f"first): {INSTALL} [{venv}]")
    return exe


def convert_data(store, out_dir: Path, tap_layer_ids: list[int], dtype: str = PUBLISHED_DTYPE) -> dict:
    """Write every example of `store` as a SpecForge offline sample (sample-NNNNNN.ckpt), its taps in `dtype` (the
    draft's: SpecForge feeds them to its `fc` as stored). Reuses a complete earlier conversion of the same data,
    taps and dtype. Examples without two consecutive response tokens are left out (SpecForge refuses them; they
    give our trainer no anchor either)."""
    import torch

    marker = out_dir / "CONVERTED.json"
    identity = tap_conversion_identity(store, tap_layer_ids) | {"dtype": dtype}
    if (done := finished_conversion(marker, identity)) is not None:
        return done
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("sample-*.ckpt"):
        old.unlink()
    written = skipped = tokens = 0
    for example in store.examples(with_hidden=True, tap_layer_ids=list(tap_layer_ids), with_teacher=False):
        length = len(example.input_ids)
        if length - example.prompt_len < 2:
            skipped += 1
            continue
        hidden = torch.zeros(length, example.hidden.shape[1], dtype=getattr(torch, dtype))
        hidden[:example.hidden.shape[0]] = example.hidden
        sample = {"input_ids": torch.tensor(example.input_ids, dtype=torch.long),
                  "loss_mask": torch.tensor(example.loss_mask, dtype=torch.long),
                  "hidden_states": hidden.contiguous()}
        torch.save(sample, out_dir / f"sample-{written:06d}.ckpt")
        written += 1
        tokens += length - example.prompt_len
    summary = identity | {"samples": written, "skipped": skipped, "response_tokens": tokens}
    marker.write_text(json.dumps(summary))
    return summary


def draft_config(drafter_config, dtype: str = PUBLISHED_DTYPE) -> dict:
    """SpecForge's DFlashDraftModel config (a Qwen3 config) for exactly our drafter's shape, taps and mask."""
    if drafter_config.variant != "dflash":
        raise ValueError("SpecForge trains DFlash only (no DFlash 2)")
    config = drafter_config.replace(target_fingerprint=None, draft_vocab_size=None,
                                    recommended_block_size=None).to_hf_dict()
    config.update(layer_types=["full_attention"] * drafter_config.num_layers, sliding_window=None,
                  use_sliding_window=False, initializer_range=0.02, dtype=dtype)
    return config


def run_config(*, target_dir: Path, draft_config_path: Path, data_dir: Path, out_dir: Path, samples: int,
               steps: int, batch_size: int, anchors: int, mask_token_id: int, max_length: int,
               dtype: str = PUBLISHED_DTYPE) -> dict:
    """One offline, single-process CPU run: SpecForge's published DFlash recipe, with what bench/peers/compare.py
    aligns (steps, batch, anchors, mask; block size, layers and taps through the draft config)."""
    epochs = math.ceil(steps * batch_size / samples) + 1  # max_steps ends the run, not the epochs
    return {
        "model": {"target_model_path": str(target_dir), "draft_model_config": str(draft_config_path),
                  "torch_dtype": dtype, "mask_token_id": mask_token_id},
        "data": {"hidden_states_path": str(data_dir), "max_length": max_length,
                 # In-process loading: worker processes would spend CPU outside the one training thread.
                 "dataloader_num_workers": 0},
        "training": {"strategy": "dflash", "num_epochs": epochs, "max_steps": steps, "batch_size": batch_size,
                     "fsdp_sharding": "NO_SHARD", "attention_backend": "sdpa", "num_anchors": anchors,
                     "log_interval": 1, **PUBLISHED_RECIPE},
        "run_id": "peers",
        "output_dir": str(out_dir),
        "deployment": {"mode": "local_colocated", "trainer": {"nnodes": 1, "nproc_per_node": 1}},
    }


def environment(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update(SPECFORGE_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return env


def train_command(venv: Path, config_path: Path) -> list[str]:
    return [str(specforge_bin(venv)), "train", "--config", str(config_path)]


def export_command(venv: Path, run_dir: Path, draft_config_path: Path, out_dir: Path, target_dir: Path) -> list[str]:
    return [str(specforge_bin(venv)), "export", "--to", "hf", "--checkpoint", str(run_dir), "--draft-config",
            str(draft_config_path), "--output-dir", str(out_dir), "--embedding-source", str(target_dir)]


def losses(log_text: str) -> list[tuple[int, float]]:
    """(step, loss) of the trainer's `step N: {...}` log lines."""
    import ast

    out = []
    for line in log_text.splitlines():
        if line.startswith("step ") and ": {" in line:
            head, body = line.split(": ", 1)
            try:
                values = ast.literal_eval(body)
                out.append((int(head.split()[1]), float(values["loss"])))
            except (ValueError, SyntaxError, KeyError):
                continue
    return out
