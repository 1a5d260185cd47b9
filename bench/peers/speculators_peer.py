"""vLLM `speculators` 0.9.0 (PyPI `speculators`, the vLLM project's drafter trainer) as a peer trainer for
bench/peers/compare.py: DFlash and DFlash 2, with or without D-PACE, on our regenerated data, our drafter shape and steps.

Install: `bash bench/setup/speculators.sh [VENV]` (default `.engines/speculators`, ignored by git): a python3.11 venv
with torch 2.13.0 (CPU) first, then `speculators==0.9.0 --no-deps`, `hs-connectors==0.9.0 --no-deps` (its
hidden-state file reader) and only what its offline trainer imports, all pinned. A bench dependency, never a
runtime one.

Data. Its trainer reads a `datasets` folder (`input_ids`, `loss_mask`, `seq_len`) and one safetensors file per
sample, `hidden_states/hs_{i}.safetensors` = {`hidden_states` [L, taps + 1, H], `token_ids` [L]}, which its
vLLM-based generator would write. The taps are ours as stored (HF `hidden_states[id + 1]`); the extra last
slice is the target's final *pre-norm* state, from which it computes its training targets (the target's own
logits through the target's final norm and LM head). Our store does not keep that state, so `convert_data`
re-runs the target (float32, in this process) over each of our sequences once to produce it; that pass also
fills the taps of each sequence's last token (our store keeps none for it) and reports how closely its taps match
the stored ones and how often the target's argmax from it equals our next token. Its layer ids count from the
embeddings (its id i reads HF `hidden_states[i]`), so our taps [1, 14, 27] are passed as [2, 15, 28].

Run. `bench/peers/speculators_launch.py` runs `speculators train`'s own entry point in-process with the venv's python,
after run-time overrides (said there): the model and batches on the CPU (its trainer uses the local rank as a
CUDA device index), autocast on "cpu" (it falls back to "cuda", which switches bfloat16 autocast off on a CPU),
accelerator synchronisation made a no-op without an accelerator, no epoch beyond the one that reaches
`--max-steps` (each would run one more step), a JSON-lines copy of its metric records, and for `ours` rows the
AdamW betas and the cosine floor its CLI cannot set. Flags: `--draft-attn-impl sdpa` (its default, flex
attention, needs torch.compile), `--loss-implementation eager` (its fused loss is for GPUs), `--num-workers 0`.

Export. Its checkpoint (`checkpoints/<last epoch>/`: `model.safetensors` in bfloat16 + its own `config.json`, a
speculators config) already carries the reference weight names; only config.json differs. `train` links the
weights, as written, into `drafter/` beside a reference-format config.json built from our DrafterConfig for the
row, after checking it against the peer's config (shape, block size, mask token, taps).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from bench.peers.peer_run import (
    OUR_SCHEDULE,
    PeerFailed,
    PeerRow,
    finished_conversion,
    require_venv,
    run_measured,
    thread_environment,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = ROOT / ".engines" / "speculators"
INSTALL = "bash bench/setup/speculators.sh"
SETUP = "bench/setup/speculators.sh"
LAUNCHER = Path(__file__).resolve().with_name("speculators_launch.py")
VERSION = "0.9.0"
DATA_FORMAT = 1
"""Bumped when convert_data's output changes, so an older conversion is redone."""

# The authors' recipe. Learning rate from their DFlash / DFlash 2 example scripts (examples/train/
# dflash_qwen3_8b_ultrachat_online_5k_bestpractices.sh, dflash2_qwen3_8b_ultrachat_online_5k.sh: --lr 3e-4); the
# rest is what their trainer does when not told otherwise: Muon on 2-D matrices (lr = --lr, momentum 0.95, weight
# decay 0.1, lr adjusted to AdamW's update RMS) with AdamW (betas 0.9/0.999, weight decay 0.01) on the rest, a
# linear schedule with 1 % warm-up, gradient clip 1.0 (fixed in its trainer), bfloat16 autocast, seed 42.
AUTHORS_RECIPE = {
    "lr": 3.0e-4,
    "optimizer": "muon",
    "weight_decay": 0.01,
    "muon_weight_decay": 0.1,
    "muon_momentum": 0.95,
    "scheduler_type": "linear",
    "dflash_decay_gamma": 4.0,
    "dpace_alpha": 0.5,
    "seed": 42,
    "hidden_states_dtype": "bfloat16",
}
DEFAULT_LOSS = {"dflash": "ce", "dflash2": "kl_div"}
"""Its loss per variant when not told otherwise (CE on the target's argmax; KL to the target's distribution)."""
DEFAULT_WEIGHTING = {"dflash": "dpace", "dflash2": "fixed-exp-decay"}
"""Its per-position weighting per variant when not told otherwise (D-PACE needs --loss-fn ce)."""


def convert_data(store, target, out_dir: Path, tap_layer_ids: list[int]) -> dict:
    """Write every example of `store` (with >= 2 response tokens) in speculators' offline format under `out_dir`,
    re-running `target` over each sequence for its final pre-norm state. Reuses a complete earlier conversion of
    the same data and taps (call under trainer.atomic.work_lock)."""
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from safetensors.torch import save_file

    marker = out_dir / "CONVERTED.json"
    identity = {"format": DATA_FORMAT, "source": str(Path(store.root).resolve()),
                "target_fingerprint": store.meta.target_fingerprint, "prompt_ids": len(store.meta.prompt_ids),
                "taps": list(tap_layer_ids)}
    if (done := finished_conversion(marker, identity)) is not None:
        return done
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    hidden_dir = out_dir / "hidden_states"
    hidden_dir.mkdir()
    norm = target.model.get_decoder().norm
    columns: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    skipped = response_tokens = agree = 0
    tap_diff = 0.0
    captured: dict = {}
    handle = norm.register_forward_pre_hook(lambda _m, args: captured.__setitem__("pre", args[0]))
    try:
        for example in store.examples(with_hidden=True, tap_layer_ids=list(tap_layer_ids), with_teacher=False):
            length = len(example.input_ids)
            if length - example.prompt_len < 2:
                skipped += 1
                continue
            ids = torch.tensor(example.input_ids, dtype=torch.long)
            logits, taps = target.forward(ids[None].to(target.device), tap_layer_ids=list(tap_layer_ids))
            taps, final = taps[0].float().cpu().clone(), captured.pop("pre")[0].float().cpu().clone()
            if example.hidden is not None:
                stored = example.hidden.float()
                tap_diff = max(tap_diff, float((stored - taps[:stored.shape[0]]).abs().max() / taps.abs().max()))
                taps[:stored.shape[0]] = stored
            predicted = logits[0, example.prompt_len - 1:-1].argmax(-1).cpu()
            agree += int((predicted == ids[example.prompt_len:]).sum())
            response_tokens += length - example.prompt_len
            states = torch.cat([taps.view(length, len(tap_layer_ids), -1), final[:, None]], dim=1)
            index = len(columns["seq_len"])
            save_file({"hidden_states": states.to(torch.bfloat16).contiguous(), "token_ids": ids},
                      hidden_dir / f"hs_{index}.safetensors")
            columns["input_ids"].append(example.input_ids)
            columns["loss_mask"].append(example.loss_mask)
            columns["seq_len"].append(length)
    finally:
        handle.remove()
    dataset = Dataset.from_dict(columns)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(out_dir / "dataset"))
    lengths = columns["seq_len"]
    summary = identity | {
        "samples": len(lengths), "skipped": skipped, "response_tokens": response_tokens,
        "mean_length": round(sum(lengths) / max(1, len(lengths)), 1), "max_length": max(lengths, default=0),
        "final_state": "target re-run (float32) over each sequence: final pre-norm state, and the last token's taps",
        "tap_rerun_max_rel_diff": round(tap_diff, 5),
        "target_argmax_equals_next_token": round(agree / max(1, response_tokens), 4)}
    marker.write_text(json.dumps(summary, indent=1))
    return summary


def draft_layer_config(drafter_config, initializer_range: float = 0.02) -> dict:
    """The decoder config (`--draft-config`, a Qwen3 config) of exactly our drafter's shape, every layer full
    attention (its default path makes every layer sliding-window)."""
    reference = drafter_config.to_hf_dict()
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "rms_norm_eps", "rope_parameters", "max_position_embeddings", "vocab_size",
            "attention_bias", "attention_dropout")
    return {"model_type": "qwen3", **{k: reference[k] for k in keys}, "tie_word_embeddings": False,
            "use_sliding_window": False, "sliding_window": None,
            "layer_types": ["full_attention"] * drafter_config.num_layers, "initializer_range": initializer_range}


def reference_config(drafter_config) -> dict:
    """config.json in the reference `dflash` format for the row's drafter (what our own trainer writes, without
    our target fingerprint and draft vocabulary)."""
    return drafter_config.replace(target_fingerprint=None, draft_vocab_size=None,
                                  recommended_block_size=None).to_hf_dict()


def batch_tokens(mean_length: float, max_length: int, batch_size: int) -> int:
    """`--total-seq-len`: its batches are token-packed rows, so `batch_size` sequences per step on average."""
    return max(int(math.ceil(batch_size * mean_length)), max_length)


def train_arguments(row: PeerRow, *, drafter_config, data_dir: Path, draft_config_path: Path, save_path: Path,
                    samples: int, total_seq_len: int) -> tuple[list[str], dict, dict]:
    """(speculators' flags, every setting set as a dict, extra environment for the launcher) for `row`."""
    if row.variant not in DEFAULT_LOSS:
        raise PeerFailed(f"speculators trains dflash and dflash2 here, not {row.variant!r}")
    if row.schedule not in ("authors", "ours"):
        raise PeerFailed(f"unknown schedule {row.schedule!r}")
    dpace = row.options.get("dpace")
    weighting = DEFAULT_WEIGHTING[row.variant] if dpace is None else ("dpace" if dpace else "fixed-exp-decay")
    loss_fn = "ce" if weighting == "dpace" else DEFAULT_LOSS[row.variant]
    settings: dict[str, Any] = {
        # aligned
        "speculator_type": row.variant,
        "target_layer_ids": [t + 1 for t in row.taps],
        "mask_token_id": row.mask_token_id,
        "block_size": row.block_size,
        "num_layers (via --draft-config)": row.layers,
        "total_seq_len": total_seq_len,
        "max_anchors": row.batch_size * row.anchors,
        "max_steps": row.steps,
        "threads": row.threads,
        "train_data_ratio": round((samples - 0.5) / samples, 6),
        "sample_from_anchor": False,
        # the peer's own, or ours where the schedule says so
        "loss_fn": loss_fn,
        "per_position_loss_weight": weighting,
        "loss_implementation": "eager",
        "draft_attn_impl": "sdpa",
        # Its draft weights and autocast take this dtype; float32 where bfloat16 is emulated (PEER_DTYPES).
        "hidden_states_dtype": "float32" if row.dtype == "float32" else AUTHORS_RECIPE["hidden_states_dtype"],
        "seed": AUTHORS_RECIPE["seed"],
        "num_workers": 0,
    }
    if weighting == "dpace":
        settings["dpace_alpha"] = AUTHORS_RECIPE["dpace_alpha"]
    # The schedule's horizon is the steps trained: left unset, speculators takes epochs x batches (the epochs above
    # are an upper bound trimmed to max_steps), and a cosine would end near 0.65x its peak instead of at its floor.
    settings["scheduler_total_steps"] = row.steps
    env: dict[str, str] = {}
    if row.schedule == "authors":
        settings.update(lr=AUTHORS_RECIPE["lr"], optimizer="muon", weight_decay=AUTHORS_RECIPE["weight_decay"],
                        muon_weight_decay=AUTHORS_RECIPE["muon_weight_decay"],
                        muon_momentum=AUTHORS_RECIPE["muon_momentum"], scheduler_type="linear",
                        scheduler_warmup_steps=max(0, row.steps // 100))
        if weighting == "fixed-exp-decay":
            settings["dflash_decay_gamma"] = AUTHORS_RECIPE["dflash_decay_gamma"]
    else:
        settings.update(lr=OUR_SCHEDULE["learning_rate"], optimizer="adamw",
                        weight_decay=OUR_SCHEDULE["weight_decay"], scheduler_type=OUR_SCHEDULE["lr_scheduler"],
                        scheduler_warmup_steps=OUR_SCHEDULE["warmup_steps"])
        if weighting == "fixed-exp-decay":
            settings["dflash_decay_gamma"] = OUR_SCHEDULE["loss_decay_gamma"]
        betas: tuple = OUR_SCHEDULE["adam_betas"]  # type: ignore[assignment]
        settings["adamw_betas (launcher)"] = list(betas)
        settings["cosine_min_lr_ratio (launcher)"] = OUR_SCHEDULE["min_lr_ratio"]
        env = {"SPECULATORS_ADAMW_BETAS": ",".join(str(b) for b in betas),
               "SPECULATORS_COSINE_MIN_LR_RATIO": str(OUR_SCHEDULE["min_lr_ratio"])}
    if row.dtype == "float32":  # torch's Muon orthogonalises in bfloat16, emulated on this CPU (the launcher)
        env["SPECULATORS_FLOAT32_MUON"] = "1"
        settings["muon_newton_schulz (launcher)"] = "float32"
    if row.variant == "dflash2":
        settings.update(conv_kernel_size=drafter_config.conv_kernel_size,
                        conv_group_size=drafter_config.conv_group_size, selector_rank=drafter_config.selector_rank,
                        selector_top_k=drafter_config.selector_top_k, selector_loss_alpha=1.0)
    epochs = math.ceil(row.steps * row.batch_size / max(1, samples)) + 2  # the launcher trims to max_steps
    flags: dict[str, Any] = {
        "verifier-name-or-path": str(row.target_dir), "data-path": str(data_dir / "dataset"),
        "hidden-states-path": str(data_dir / "hidden_states"), "on-missing": "raise",
        "save-path": str(save_path), "log-dir": str(save_path.parent / "logs"), "draft-config": str(draft_config_path),
        "epochs": epochs, "checkpoint-freq": 1, "log-freq": 1, "prefetch-factor": 2,
    }
    for key, value in settings.items():
        if " (" in key:  # set another way (draft config, launcher), not a flag
            continue
        flags[key.replace("_", "-")] = value
    flags.pop("threads")
    argv = []
    for key, value in flags.items():
        if isinstance(value, bool):
            argv.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, list):
            argv += [f"--{key}", *(str(v) for v in value)]
        else:
            argv += [f"--{key}", str(value)]
    settings["epochs (upper bound; trimmed to max_steps)"] = epochs
    settings["max_grad_norm (fixed in its trainer)"] = 1.0
    return argv, settings, env


NOT_ALIGNED = {
    "batch": "its batches are token-packed rows, not a sequence count: total_seq_len = batch x mean length, "
             "so 'batch' sequences per step on average (packing decides each step's count)",
    "anchors": "max_anchors = batch x anchors per packed row, drawn at random among all its response positions "
               "(about 'anchors' per sequence on average, more for longer ones)",
    "held-out sample": "its trainer requires a validation split (0 < train_data_ratio < 1): the last converted "
                       "sample is held out (and scored once per epoch), the rest train",
    "targets": "it supervises with the target's own prediction recomputed from the final pre-norm state "
               "(argmax for ce, the distribution for kl_div), not our stored next tokens; on greedy regenerated "
               "data these agree (see conversion's target_argmax_equals_next_token)",
    "ours: weight decay": "applied to every trainable parameter (ours: matrices only)",
    "ours: optimizer": "ours rows use its plain AdamW (optimizer=adamw); betas and the cosine floor are set by "
                       "the launcher because its CLI has no flag for them",
    "dflash2 + D-PACE": "D-PACE requires its CE loss, so a dflash2 D-PACE row trains with ce instead of its "
                        "default kl_div",
}


def check_peer_config(peer: dict, drafter_config) -> list[str]:
    """Where the peer's own config.json disagrees with the reference config we write beside its weights."""
    layer = peer.get("transformer_layer_config") or {}
    expected = {
        "block_size": (peer.get("block_size"), drafter_config.block_size),
        "mask_token_id": (peer.get("mask_token_id"), drafter_config.mask_token_id),
        "target_layer_ids": ([i - 1 for i in peer.get("aux_hidden_state_layer_ids") or []],
                             list(drafter_config.target_layer_ids)),
        "num_hidden_layers": (layer.get("num_hidden_layers"), drafter_config.num_layers),
        "hidden_size": (layer.get("hidden_size"), drafter_config.hidden_size),
        "intermediate_size": (layer.get("intermediate_size"), drafter_config.intermediate_size),
        "num_attention_heads": (layer.get("num_attention_heads"), drafter_config.num_attention_heads),
        "num_key_value_heads": (layer.get("num_key_value_heads"), drafter_config.num_key_value_heads),
        "architectures": ((peer.get("architectures") or [None])[0],
                          reference_config(drafter_config)["architectures"][0]),
    }
    if drafter_config.variant == "dflash2":
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            expected[key] = (peer.get(key), getattr(drafter_config, key))
    return [f"{k}: peer {a!r}, expected {b!r}" for k, (a, b) in expected.items() if a != b]


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(save_path: Path, out_dir: Path, drafter_config) -> dict:
    """The last epoch's checkpoint as a reference-format drafter in `out_dir`: its weights as written (a hard
    link, or a copy across file systems) and a reference config.json; its own config.json stays where it is."""
    epochs = sorted(int(p.name) for p in save_path.iterdir() if p.is_dir() and not p.is_symlink()
                    and p.name.isdigit()) if save_path.is_dir() else []
    if not epochs:
        raise PeerFailed(f"speculators wrote no checkpoint under {save_path}")
    checkpoint = save_path / str(epochs[-1])
    peer_config = json.loads((checkpoint / "config.json").read_text())
    mismatches = check_peer_config(peer_config, drafter_config)
    if mismatches:
        raise PeerFailed(f"speculators' checkpoint {checkpoint} is not the drafter asked for: {'; '.join(mismatches)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "model.safetensors"
    try:
        os.link(checkpoint / "model.safetensors", weights)
    except OSError:
        shutil.copy2(checkpoint / "model.safetensors", weights)
    (out_dir / "config.json").write_text(json.dumps(reference_config(drafter_config), indent=1))
    return {"checkpoint": str(checkpoint), "weights": "as written by speculators (bfloat16, reference names)",
            "config_json": "rewritten in the reference dflash format beside the weights; speculators' own "
                           f"config.json ({peer_config.get('speculators_model_type')}, aux_hidden_state_layer_ids "
                           f"{peer_config.get('aux_hidden_state_layer_ids')}) is kept in the checkpoint"}


def train(row: PeerRow, venv: Path = DEFAULT_VENV) -> tuple[Path, dict]:
    import torch

    from trainer.atomic import work_lock
    from trainer.data.store import DataStore
    from trainer.drafter.config import DrafterConfig
    from trainer.targets import load_target

    python = require_venv(Path(venv), "bin/python", SETUP)
    target = load_target(row.target_dir)
    variant: Any = row.variant
    drafter_config = DrafterConfig.for_target(target, variant=variant, num_layers=row.layers,
                                              block_size=row.block_size, mask_token_id=row.mask_token_id,
                                              target_layer_ids=list(row.taps))
    data_dir = row.work / "speculators-data"
    threads = torch.get_num_threads()
    torch.set_num_threads(row.threads)
    try:
        with work_lock(data_dir):
            converted = convert_data(DataStore.open(row.data_dir), target, data_dir, list(row.taps))
    finally:
        torch.set_num_threads(threads)
    draft_config_path = row.row_dir / "draft_config.json"
    draft_config_path.write_text(json.dumps(
        draft_layer_config(drafter_config, getattr(target.config, "initializer_range", 0.02)), indent=1))
    del target
    save_path = row.row_dir / "checkpoints"
    argv, settings, extra_env = train_arguments(
        row, drafter_config=drafter_config, data_dir=data_dir, draft_config_path=draft_config_path,
        save_path=save_path, samples=converted["samples"],
        total_seq_len=batch_tokens(converted["mean_length"], converted["max_length"], row.batch_size))
    (row.row_dir / "train_args.json").write_text(json.dumps({"argv": argv, "env": extra_env}, indent=1))
    metrics_path = row.row_dir / "metrics.jsonl"
    env = thread_environment(row.threads, SPECULATORS_METRICS_JSONL=str(metrics_path), **extra_env)
    status, cpu, wall = run_measured([str(python), str(LAUNCHER), *argv], row.log, env)
    if status:
        tail = "\n".join(row.log.read_text(errors="replace").splitlines()[-25:]) if row.log.is_file() else ""
        raise PeerFailed(f"speculators train exited {status}; see {row.log}:\n{tail}")
    records = [r for r in read_metrics(metrics_path) if "train" in r]
    exported = export(save_path, row.row_dir / "drafter", drafter_config)
    last = records[-1] if records else {}
    return row.row_dir / "drafter", {
        "steps": (last.get("global_step", -1) + 1) if records else 0,
        "final_loss": last.get("train", {}).get("loss"),
        "train_tau_estimate": last.get("train", {}).get("eal"),
        "train_cpu_s": round(cpu, 1), "train_wall_s": round(wall, 1),
        "samples": converted["samples"], "conversion": converted, "settings": settings,
        "not_aligned": NOT_ALIGNED, "export": exported, "peer": f"speculators {VERSION}",
    }
