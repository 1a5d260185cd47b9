"""NVIDIA ModelOpt 0.47.0 (PyPI `nvidia-modelopt`) as a peer trainer for bench/peers/compare.py: DFlash with D-PACE
(its default `dflash_loss_objective: dpace`) and self-logit distillation, no DFlash 2.

Install: `bash bench/setup/modelopt.sh` (its own venv, default `.engines/modelopt`; torch 2.13.0 CPU first, then
`nvidia-modelopt==0.47.0 --no-deps` and the pinned light packages it imports). A bench dependency, never a
runtime one.

Run: ModelOpt's training script (`examples/speculative_decoding/main.py`) is not in the wheel, so
bench/peers/modelopt_launch.py, executed with the venv's python, does what that script does with the library's own
parts: `load_recipe` of the packaged DFlash recipe (`general/speculative_decoding/dflash`, the authors' recipe)
with this row's dotlist overrides, `load_vlm_or_llm(..., use_offline_training=True)`, `mtsp.convert(model,
[("dflash", ...)])`, the wheel's `OfflineSupervisedDataset` + `EagleOfflineDataCollator`, a
`transformers.Trainer` with the recipe's `training` section, `save_model`, then `export_speculative_decoding`
(the z-lab `dflash` format). It trains OFFLINE: the target never runs; the taps and the target's final hidden
state (for the distillation logits, through the frozen LM head) come from our regenerated data.

What is overridden at run time and why (see the launcher): the Trainer runs with `use_cpu`, `tf32: false` (tf32
is a CUDA setting that the Trainer refuses without a GPU), `report_to: none` (tensorboard is not installed;
nothing of the training depends on it), `save_strategy: no` (the recipe saves every 5,000 steps, never reached);
the final `save_model` writes the weights, then fails to pickle `training_args.bin` (main.py's
`HfTrainingArguments` is a dataclass made at run time, which pickle cannot look up), which the launcher tolerates
after checking the weights exist. Nothing else is overridden: no CUDA-only call is reached on this path.
transformers is 5.14.1 in its venv (ModelOpt 0.47 supports <5.15; under 5.24 its draft module fails). The
recipe's `training_seq_len: 4096` becomes the longest of our sequences rounded up to the block (ModelOpt pads
every sequence to it; the padding is masked, so only its cost differs).

Offline data: one `torch.save` file per example (`sample-NNNNNN.pt`) with `input_ids [L]`, `loss_mask [L]` (1 on
response tokens), `aux_hidden_states [L, taps*H]` (HF `hidden_states[id + 1]` of each tap, concatenated, our
convention and ModelOpt's) and `hidden_states [L, H]`, the target's final normed hidden state (what its LM head
reads), from our teacher signal: row j of `teacher_final` is position prompt_len - 1 + j. Positions without one
(the prompt, the last token) are zero; they are never a distillation target that carries weight (ModelOpt
weights block position k by the loss mask of token anchor + k, and anchors are response tokens).

One tapped layer per drafter layer (ModelOpt refuses `target_layer_ids` of another length), so with taps
(1, 14, 27) the drafter has 3 layers; other counts are refused. The drafter's widths are given explicitly: for a
Llama target ModelOpt would otherwise keep its Qwen3Config defaults (32 heads of 128, intermediate 22,016).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from bench.peers.peer_run import (
    ENGINES,
    OUR_SCHEDULE,
    PeerFailed,
    PeerRow,
    conversion_dir,
    conversion_dtype,
    finished_conversion,
    require_venv,
    run_measured,
    tap_conversion_identity,
    thread_environment,
)

DEFAULT_VENV = ENGINES / "modelopt"
SETUP = "bench/setup/modelopt.sh"
LAUNCHER = Path(__file__).resolve().with_name("modelopt_launch.py")
VERSION = "0.47.0"
RECIPE = "general/speculative_decoding/dflash"
"""The DFlash recipe shipped in the wheel (modelopt_recipes/general/speculative_decoding/dflash.yaml)."""

AUTHORS_RECIPE = {
    # What that recipe sets (and the defaults it leaves: HF Trainer's AdamW betas 0.9/0.999, clip 1.0, seed 42;
    # ModelOpt's DFlashConfig: D-PACE with alpha 0.5). Recorded, never written: the launcher loads the recipe.
    "learning_rate": 6.0e-4, "warmup_steps": 100, "lr_scheduler_type": "linear", "weight_decay": 0.0,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "max_grad_norm": 1.0, "bf16": True, "num_train_epochs": 10,
    "dflash_loss_objective": "dpace", "dflash_dpace_alpha": 0.5, "dflash_loss_decay_factor": 4.0,
    "dflash_self_logit_distillation": True, "dflash_num_anchors": 512, "num_hidden_layers": 5,
    "training_seq_len": 4096,
}


def convert_data(store, out_dir: Path, tap_layer_ids: list[int], dtype: str | None = None) -> dict:
    """Write every example of `store` as a ModelOpt offline sample (sample-NNNNNN.pt), its hidden states in `dtype`
    (None: as stored; a float32 row needs float32, which its lm_head and fc take as they are). Reuses a complete
    earlier conversion of the same data, taps and dtype. Examples without two response tokens are left out (no
    anchor)."""
    import torch

    marker = out_dir / "CONVERTED.json"
    identity = tap_conversion_identity(store, tap_layer_ids) | ({"dtype": dtype} if dtype else {})
    if (done := finished_conversion(marker, identity)) is not None:
        return done
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("sample-*.pt"):
        old.unlink()
    written = skipped = tokens = with_final = max_length = 0
    for example in store.examples(with_hidden=True, tap_layer_ids=list(tap_layer_ids), with_teacher=True):
        length, start = len(example.input_ids), example.prompt_len
        if length - start < 2:
            skipped += 1
            continue
        if example.hidden is None:
            raise PeerFailed(f"{store.root} keeps no hidden states: ModelOpt trains offline from cached taps")
        stored = getattr(torch, dtype) if dtype else example.hidden.dtype
        aux = torch.zeros(length, example.hidden.shape[1], dtype=stored)
        aux[:example.hidden.shape[0]] = example.hidden
        final = torch.zeros(length, example.hidden.shape[1] // len(tap_layer_ids), dtype=stored)
        if example.teacher is not None and example.teacher.final_hidden.shape[0] == length - start:
            final[start - 1:length - 1] = example.teacher.final_hidden.to(final.dtype)
            with_final += 1
        torch.save({"input_ids": torch.tensor(example.input_ids, dtype=torch.long),
                    "loss_mask": torch.tensor(example.loss_mask, dtype=torch.long),
                    "aux_hidden_states": aux.contiguous(), "hidden_states": final.contiguous()},
                   out_dir / f"sample-{written:06d}.pt")
        written += 1
        tokens += length - start
        max_length = max(max_length, length)
    summary = identity | {"samples": written, "skipped": skipped, "response_tokens": tokens,
                          "with_final_hidden": with_final, "max_length": max_length}
    marker.write_text(json.dumps(summary))
    return summary


def drafter_shape(target_dir: Path, row: PeerRow) -> dict:
    """Our DrafterConfig for this target and row (its widths, taps, mask, block), as ModelOpt's
    `dflash_architecture_config` keys."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from trainer.drafter.config import DrafterConfig

    hf = AutoConfig.from_pretrained(target_dir)
    text = getattr(hf, "text_config", None) or hf
    config = DrafterConfig.for_target(
        SimpleNamespace(config=text, num_layers=text.num_hidden_layers, vocab_size=text.vocab_size, fingerprint=None),
        variant="dflash", num_layers=row.layers, block_size=row.block_size, mask_token_id=row.mask_token_id,
        target_layer_ids=list(row.taps))
    return {"num_hidden_layers": config.num_layers, "target_layer_ids": list(config.target_layer_ids),
            "intermediate_size": config.intermediate_size, "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
            "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "num_target_layers": config.num_target_layers}


def settings_for(row: PeerRow, *, shape: dict, data_dir: Path, max_length: int, final_hidden: bool) -> dict:
    """Every recipe key this row sets (dotted paths into the recipe), both schedules."""
    if row.variant != "dflash":
        raise PeerFailed(f"ModelOpt {VERSION} trains DFlash only (no DFlash 2); row variant {row.variant!r}")
    if row.layers != len(row.taps):
        raise PeerFailed(f"ModelOpt taps one target layer per drafter layer: {len(row.taps)} taps {list(row.taps)} "
                         f"need {len(row.taps)} drafter layers, not {row.layers}")
    if row.schedule not in ("authors", "ours"):
        raise PeerFailed(f"unknown schedule {row.schedule!r}")
    arch = {k: v for k, v in shape.items() if k != "num_target_layers"}
    settings = {
        "model.model_name_or_path": str(row.target_dir),
        "data.offline_data_path": str(data_dir),
        "training.output_dir": str(row.row_dir / "run"),
        "training.max_steps": row.steps,
        "training.per_device_train_batch_size": row.batch_size,
        "training.gradient_accumulation_steps": 1,
        "training.training_seq_len": math.ceil(max_length / row.block_size) * row.block_size,
        "training.logging_steps": 1,
        "training.save_strategy": "no",
        "training.report_to": "none",
        "training.tf32": False,
        "training.use_cpu": True,
        "training.dataloader_num_workers": 0,
        "dflash.dflash_block_size": row.block_size,
        "dflash.dflash_num_anchors": row.anchors,
        "dflash.dflash_mask_token_id": row.mask_token_id,
        **{f"dflash.dflash_architecture_config.{k}": v for k, v in arch.items()},
        "dflash.dflash_loss_objective": "dpace" if row.options.get("dpace", True) else "decay",
    }
    if row.dtype == "float32":  # no bfloat16 units on this CPU: its autocast off (bench/peers/peer_run.py PEER_DTYPES)
        settings["training.bf16"] = False
    if not final_hidden:  # no teacher signal in the data: distillation has no target, train on the tokens
        settings["dflash.dflash_self_logit_distillation"] = False
    if row.schedule == "ours":
        settings.update({
            "training.learning_rate": OUR_SCHEDULE["learning_rate"],
            "training.warmup_steps": OUR_SCHEDULE["warmup_steps"],
            "training.lr_scheduler_type": "cosine_with_min_lr",
            "training.lr_scheduler_kwargs": {"min_lr_rate": OUR_SCHEDULE["min_lr_ratio"]},
            "training.adam_beta1": OUR_SCHEDULE["adam_betas"][0],
            "training.adam_beta2": OUR_SCHEDULE["adam_betas"][1],
            "training.weight_decay": OUR_SCHEDULE["weight_decay"],
            "training.max_grad_norm": OUR_SCHEDULE["max_grad_norm"],
            # Used only when D-PACE is off: D-PACE's confidence weights replace the fixed decay.
            "dflash.dflash_loss_decay_factor": OUR_SCHEDULE["loss_decay_gamma"],
        })
    return settings


NOT_ALIGNED = {
    "loss_decay_gamma": "D-PACE (its default, kept on) weights block positions by the drafter's own confidence "
                        "instead of a fixed exp(-(k-1)/gamma); gamma is set but unused",
    "loss": "self-logit distillation (its default): cross-entropy against the target's full distribution at each "
            "position (from the target's final hidden state in our data), not against the regenerated token",
    "precision": "the target's float32 weights (dtype auto) for the drafter too, bfloat16 autocast (recipe bf16: "
                 "true; off in a --peer-dtype float32 row); ours the same; AdamW on float32 weights",
    "training_seq_len": "every sequence is padded to one length (ours: the data's longest, rounded up to the block; "
                        "the recipe's 4096 would cost ~17x per step for masked padding)",
    "optimizer_kind": "HF Trainer's default AdamW (adamw_torch_fused) in both schedules; ours: AdamW",
    "weight_decay_params": "HF Trainer decays every weight but biases and norms; ours: matrices only",
    "data_order": "HF Trainer's seeded random sampler (seed 42), last partial batch dropped (recipe)",
    "init": "N(0, 0.02) on every linear (ModelOpt's _init_weights); ours: whitened fc",
    "tf32": "recipe tf32: true is CUDA-only; false on this CPU",
}


def overrides(settings: dict) -> list[str]:
    """The settings as ModelOpt's `load_recipe` dotlist, whose values it parses with yaml.safe_load (YAML 1.1:
    JSON's `1e-05` would come back a string, an unquoted `no` a boolean), so each value is written as YAML."""
    import yaml

    def encode(value) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
        return text[:-len("\n...")] if text.endswith("\n...") else text

    return [f"{key}={encode(value)}" for key, value in settings.items()]


def launch_command(venv: Path, config_path: Path) -> list[str]:
    return [str(venv / "bin" / "python"), str(LAUNCHER), str(config_path)]


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fix_config(export_dir: Path, shape: dict) -> dict:
    """The exported config.json, corrected where ModelOpt's offline run writes a wrong value (weights untouched):
    `num_target_layers` is the offline base's layer count, 0 (it was loaded without its layers). The file as
    ModelOpt wrote it is kept as config.modelopt.json. Returns {key: [written, corrected]}."""
    path = export_dir / "config.json"
    written = json.loads(path.read_text())
    changed = {}
    if written.get("num_target_layers") != shape["num_target_layers"]:
        changed["num_target_layers"] = [written.get("num_target_layers"), shape["num_target_layers"]]
    if changed:
        (export_dir / "config.modelopt.json").write_text(path.read_text())
        path.write_text(json.dumps(written | {k: v[1] for k, v in changed.items()}, indent=1))
    return changed


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def train(row: PeerRow, venv: Path) -> tuple[Path, dict]:
    from trainer.atomic import work_lock
    from trainer.data.store import DataStore

    require_venv(venv, "bin/python", SETUP)
    if row.variant != "dflash":
        raise PeerFailed(f"ModelOpt {VERSION} trains DFlash only (no DFlash 2); row variant {row.variant!r}")
    data_dir = conversion_dir(row.work, "modelopt", row.dtype)
    with work_lock(data_dir):
        converted = convert_data(DataStore.open(row.data_dir), data_dir, list(row.taps),
                                 conversion_dtype(row.dtype))
    shape = drafter_shape(row.target_dir, row)
    settings = settings_for(row, shape=shape, data_dir=data_dir, max_length=converted["max_length"],
                            final_hidden=converted["with_final_hidden"] == converted["samples"])
    export_dir = row.row_dir / "export"
    metrics = row.row_dir / "metrics.jsonl"
    config_path = row.row_dir / "modelopt_run.json"
    config_path.write_text(json.dumps({"recipe": RECIPE, "overrides": overrides(settings), "export_dir": str(export_dir),
                                       "metrics": str(metrics)}, indent=1))
    status, cpu, wall = run_measured(launch_command(venv, config_path), row.log, thread_environment(row.threads))
    if status:
        raise PeerFailed(f"ModelOpt launcher exited {status}; {row.log} ends:\n{tail(row.log)}")
    if not (export_dir / "model.safetensors").is_file() or not (export_dir / "config.json").is_file():
        raise PeerFailed(f"ModelOpt export wrote no model.safetensors/config.json in {export_dir}; "
                         f"{row.log} ends:\n{tail(row.log)}")
    config_fixed = fix_config(export_dir, shape)
    logged = read_metrics(metrics)
    losses = [m for m in logged if "loss" in m]
    done = next((m for m in reversed(logged) if m.get("event") == "done"), {})
    # CPU seconds per step inside the training loop (start-up, conversion and export excluded): from the
    # launcher's process_time at each step's log, over the steps after the first.
    loop_cpu = (round((losses[-1]["cpu_s"] - losses[0]["cpu_s"]) / (len(losses) - 1), 3)
                if len(losses) > 1 and "cpu_s" in losses[0] else None)
    return export_dir, {
        "steps": losses[-1]["step"] if losses else done.get("global_step", row.steps),
        "final_loss": losses[-1]["loss"] if losses else None,
        "final_train_acc": losses[-1].get("train_acc") if losses else None,
        "train_cpu_s": round(cpu, 1), "train_wall_s": round(wall, 1),
        "train_loop_s": done.get("train_s"), "loop_cpu_s_per_step": loop_cpu, "samples": converted["samples"],
        "settings": settings, "recipe": RECIPE, "not_aligned": NOT_ALIGNED,
        "schedule_settings": AUTHORS_RECIPE if row.schedule == "authors" else OUR_SCHEDULE,
        "online_target": False, "distillation": settings.get("dflash.dflash_self_logit_distillation", True),
        "final_save": done.get("final_save"), "config_fixed": config_fixed,
        "peer": f"nvidia-modelopt {VERSION}", "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
