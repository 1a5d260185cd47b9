"""NVIDIA NeMo Automodel 0.7.0 (PyPI `nemo-automodel`) as a peer trainer for bench/peers/compare.py: its DFlash and
DFlash 2 recipes (`nemo_automodel.recipes.llm.train_dflash` / `train_dflash2`) on our regenerated data.

Install: `bash bench/setup/nemo_automodel.sh [VENV]` (default `.engines/nemo_automodel`, ignored by git):
torch 2.13.0 (CPU) first, then `nemo-automodel==0.7.0 --no-deps` and only what its DFlash path imports. A bench
dependency, never a runtime one.

Run: `bench/peers/nemo_automodel_launch.py train RUN.yaml` with the peer venv's python, as its own measured process
(`run_measured`, one thread, under nice). The launcher runs NeMo's recipe in-process after five run-time
overrides (its installed sources are never changed), each needed on this CPU or by the bench:
  1-2. `NeMoAutoModelForCausalLM.from_pretrained` calls `torch.cuda.current_device()` unconditionally, twice
       (a CPU torch raises); the launcher answers 0 and materialises the frozen target on the CPU instead.
  3.   NeMo's DFlash registry lists no Llama targets: SmolLM2 (a Llama) is mapped to the Qwen3 entry.
  4.   Its chat dataset's own `mask_history` switch is turned on (the DFlash recipes do not pass it), so a
       multi-turn prompt's earlier assistant turns stay unsupervised context, as in our data.
  5.   NeMo has no max_steps (it runs whole epochs): the schedule's horizon is set to row.steps and the loader
       stops after that many optimizer steps.
NeMo's own choices on a CPU stay: float32 target and draft (it uses bfloat16 only on CUDA), `sdpa` attention
(its default `flex_attention` wants a GPU), its seed 42, its data order (a shuffle per epoch, the last partial
batch kept).

Data: NeMo reads chat JSONL (OpenAI `messages`) and re-tokenizes it with the target's chat template, and it
runs the target online every step for the tapped hidden states (our cached taps are not used). So each of our
examples becomes its prompt's messages plus one assistant turn (our regenerated response, decoded), and only
the subset that re-tokenizes identically is kept: NeMo's own tokenization (the launcher's `tokenize`, the
same ChatDataset settings as training) must start with exactly our input_ids and supervise exactly our response
tokens. The rest is dropped and counted (on the main job's data: 207 of 226 kept, the 19 dropped are responses
whose decode/encode round trip changes tokens). What cannot be aligned: NeMo renders the assistant turn closed,
so every kept example carries the template's closing tokens after our response (`<|im_end|>\\n` after a
length-cut response, `\\n` after one that ended itself), supervised by NeMo. It pads every sequence to
`seq_length`, set to the longest kept example (235 tokens there).

Export: NeMo's final checkpoint holds a consolidated HF folder (`model/consolidated`: the reference tensor names,
released codebook spelling) whose config.json names the architecture `Qwen3DFlashDraftModel` for DFlash and
DFlash 2 alike. The drafter folder gets those weights byte for byte as model.safetensors (a hard link) and a
config.json that differs from NeMo's only in `architectures` (DFlashDraftModel / DFlash2DraftModel); NeMo's own
is kept beside it as config.nemo.json.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

from bench.peers.peer_run import (
    ENGINES,
    OUR_SCHEDULE,
    ROOT,
    PeerFailed,
    PeerRow,
    finished_conversion,
    require_venv,
    run_measured,
    thread_environment,
)

PEER = "nemo_automodel"
VERSION = "0.7.0"
DEFAULT_VENV = ENGINES / PEER
SETUP = "bench/setup/nemo_automodel.sh"
LAUNCHER = Path(__file__).resolve().with_name("nemo_automodel_launch.py")
ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}

# NeMo's published recipes (its repository's examples/speculative/dflash/qwen3_dflash.yaml and
# qwen3_dflash2.yaml, for Qwen3-8B): AdamW lr 6e-4, betas 0.9/0.95, no weight decay, warm-up 4 % of the steps,
# cosine to 0.1 x peak, clip 1.0, position decay gamma 7, shuffle seed 42; DFlash 2 selector loss weight 1.0.
AUTHORS_RECIPE = {
    "learning_rate": 6.0e-4,
    "adam_betas": (0.9, 0.95),
    "weight_decay": 0.0,
    "warmup_ratio": 0.04,
    "lr_scheduler": "cosine",
    "min_lr_ratio": 0.1,
    "max_grad_norm": 1.0,
    "loss_decay_gamma": 7.0,
}
SEED = 42
SELECTOR_LOSS_WEIGHT = 1.0

NOT_ALIGNED = {
    "weight_decay": f"NeMo has one parameter group: `ours` puts {OUR_SCHEDULE['weight_decay']} on every parameter "
                    "(ours: matrices only)",
    "warmup": "NeMo's warm-up ramps (step+1)/W, ours (step+1)/(W+1)",
    "precision": "NeMo trains in float32 on a CPU (bfloat16 on CUDA only); ours: bfloat16 matmuls under autocast",
    "hidden_states": "NeMo recomputes the taps online every step in float32; ours reads the taps cached at "
                     "generation (bfloat16)",
    "data": "the subset that re-tokenizes identically; NeMo adds the chat template's closing tokens after each "
            "response and supervises them",
    "batches": "NeMo keeps each epoch's last partial batch (drop_last=False)",
    "seed_and_order": "NeMo's seed 42 and its own per-epoch shuffle",
    "init": "NeMo's HF init (N(0, 0.02)); ours whitens fc's input channels",
    "vocabulary": "full vocabulary (no draft vocabulary)",
    "dflash2_selector_loss": "NeMo's own selector loss, weight 1.0",
}


def schedule_settings(schedule: str, steps: int) -> tuple[dict, int | None, float]:
    """(the optimizer section of NeMo's config, the launcher's fixed warm-up steps or None for NeMo's own
    warm-up ratio, the loss decay gamma) for `authors` or `ours`."""
    if schedule == "authors":
        recipe = AUTHORS_RECIPE
        warmup_steps = None
        warmup_ratio = recipe["warmup_ratio"]
    elif schedule == "ours":
        recipe = OUR_SCHEDULE
        warmup_steps = int(recipe["warmup_steps"])  # fixed, whatever the run length (the launcher sets it)
        warmup_ratio = min(1.0, warmup_steps / max(1, steps))
    else:
        raise PeerFailed(f"unknown schedule {schedule!r} (authors or ours)")
    if recipe["lr_scheduler"] != "cosine":
        raise PeerFailed(f"NeMo's recipe has only warm-up + cosine, not {recipe['lr_scheduler']}")
    optimizer = {"lr": float(recipe["learning_rate"]), "betas": [float(b) for b in recipe["adam_betas"]],
                 "weight_decay": float(recipe["weight_decay"]), "warmup_ratio": float(warmup_ratio),
                 "min_lr_ratio": float(recipe["min_lr_ratio"])}
    return optimizer, warmup_steps, float(recipe["loss_decay_gamma"])


def chat_row(messages, tools, response_text: str) -> dict:
    """One NeMo chat JSONL row: the prompt's messages and our response as the assistant turn."""
    row = {"messages": [dict(m) for m in messages] + [{"role": "assistant", "content": response_text}]}
    if tools:
        row["tools"] = [dict(t) for t in tools]
    return row


def compare(ours_ids: list[int], prompt_len: int, nemo_ids: list[int], nemo_mask: list[int]) -> str | None:
    """None when NeMo's tokenization is ours followed only by the template's closing tokens, with our
    response tokens (and only them) supervised over our span; else why not."""
    n = len(ours_ids)
    if nemo_ids[:n] != list(ours_ids):
        return "tokens differ" if nemo_ids[:prompt_len] == list(ours_ids[:prompt_len]) else "prompt tokens differ"
    if list(nemo_mask[:n]) != [0] * prompt_len + [1] * (n - prompt_len):
        return "supervised tokens differ"
    return None


def nemo_tokenize(venv: Path, target_dir: Path, rows: Path, out: Path, threads: int = 1) -> list[dict]:
    """NeMo's own tokenization of the chat rows in `rows` (the launcher's `tokenize`, in the peer venv):
    [{"input_ids", "loss_mask"}] per row, unpadded."""
    python = require_venv(venv, "bin/python", SETUP)
    done = subprocess.run(["nice", "-n", "10", str(python), str(LAUNCHER), "tokenize", str(target_dir), str(rows),
                           str(out)], env=thread_environment(threads), cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise PeerFailed(f"NeMo's tokenization of our rows failed:\n{(done.stdout + done.stderr)[-2000:]}")
    return json.loads(out.read_text())


def convert_data(store, out_dir: Path, target_dir: Path, venv: Path, threads: int = 1, prompts=None) -> dict:
    """Write train.jsonl (the subset of `store` that NeMo re-tokenizes identically) and CONVERTED.json under
    `out_dir`; reuse an earlier conversion of the same data with the same target. `prompts`: the prompts the data
    was regenerated from (default: the built-in set, what the bench's data uses)."""
    from transformers import AutoTokenizer

    from trainer.data.prompts import load_prompts

    marker = out_dir / "CONVERTED.json"
    identity = {"source": str(store.root), "target_fingerprint": store.meta.target_fingerprint,
                "prompt_ids": len(store.meta.prompt_ids), "target_dir": str(target_dir), "nemo": VERSION,
                "format": "chat messages, last assistant turn supervised"}
    if (done := finished_conversion(marker, identity)) is not None:
        return done
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = {p.id: p for p in (load_prompts() if prompts is None else prompts)}
    system_prompt = (store.meta.sampling.get("chat_template") or {}).get("system_prompt")
    candidates, rows, dropped = [], [], {}
    for example in store.examples(with_hidden=False, with_teacher=False):
        prompt = prompts.get(example.id)
        if prompt is None:
            dropped["prompt not in the built-in set"] = dropped.get("prompt not in the built-in set", 0) + 1
            continue
        messages = list(prompt.messages)
        if system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        response = list(example.input_ids[example.prompt_len:])
        if response and response[-1] == tokenizer.eos_token_id:  # the template closes the turn itself
            response = response[:-1]
        candidates.append(example)
        rows.append(chat_row(messages, prompt.tools, tokenizer.decode(response)))
    all_rows = out_dir / "candidates.jsonl"
    all_rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    nemo = nemo_tokenize(venv, target_dir, all_rows, out_dir / "nemo_tokens.json", threads)
    kept, tails, lengths = [], {}, []
    for example, row, theirs in zip(candidates, rows, nemo, strict=True):
        why = compare(example.input_ids, example.prompt_len, theirs["input_ids"], theirs["loss_mask"])
        if why:
            dropped[why] = dropped.get(why, 0) + 1
            continue
        tail = len(theirs["input_ids"]) - len(example.input_ids)
        tails[str(tail)] = tails.get(str(tail), 0) + 1
        lengths.append(len(theirs["input_ids"]))
        kept.append((example, row))
    if not kept:
        raise PeerFailed(f"no example of {store.root} re-tokenizes identically under NeMo's chat formatting "
                         f"({dropped})")
    (out_dir / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for _, row in kept))
    summary = identity | {
        "candidates": len(candidates) + sum(v for k, v in dropped.items() if k.startswith("prompt not")),
        "samples": len(kept), "dropped": dropped, "template_tail_tokens": tails,
        "response_tokens": sum(len(e.input_ids) - e.prompt_len for e, _ in kept),
        "max_length": max(lengths), "kept_ids": [e.id for e, _ in kept],
        "subset": "the subset that re-tokenizes identically"}
    marker.write_text(json.dumps(summary))
    return summary


def run_config(row: PeerRow, data_path: Path, samples: int, seq_length: int, out_dir: Path) -> tuple[dict, int | None]:
    """NeMo's recipe config for this row, and the launcher's fixed warm-up steps (None: NeMo's ratio)."""
    if row.variant not in ARCHITECTURES:
        raise PeerFailed(f"NeMo Automodel trains dflash and dflash2, not {row.variant!r}")
    optimizer, warmup_steps, gamma = schedule_settings(row.schedule, row.steps)
    batches_per_epoch = math.ceil(samples / row.batch_size)
    recipe_args = {
        "target_model_name_or_path": str(row.target_dir), "train_data_path": str(data_path),
        "val_data_path": None, "output_dir": str(out_dir),
        # NeMo pads every sequence to seq_length: the longest kept example (nothing truncated).
        "seq_length": int(seq_length), "micro_batch_size": row.batch_size, "grad_accumulation_steps": 1,
        "num_workers": 0,  # in-process loading: worker processes would spend CPU outside the one thread
        "num_epochs": max(1, math.ceil(row.steps / batches_per_epoch)),  # the launcher stops at row.steps
        "draft_num_hidden_layers": row.layers, "block_size": row.block_size, "num_anchors": row.anchors,
        "loss_decay_gamma": gamma, "mask_token_id": row.mask_token_id, "target_layer_ids": list(row.taps),
        "attention_backend": "sdpa", "mask_generation_prompt": True, "trust_remote_code": False,
        "shuffle_seed": SEED, "log_every_steps": 1,
        "max_grad_norm": float((AUTHORS_RECIPE if row.schedule == "authors" else OUR_SCHEDULE)["max_grad_norm"]),
    }
    if row.variant == "dflash2":
        recipe_args.update(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16,
                           selector_loss_weight=SELECTOR_LOSS_WEIGHT)
    config = {
        "recipe": "TrainDFlash2Recipe" if row.variant == "dflash2" else "TrainDFlashRecipe",
        "dist_env": {"backend": "gloo", "timeout_minutes": 30},
        "recipe_args": recipe_args,
        "optimizer": optimizer,
        "checkpoint": {"enabled": True, "checkpoint_dir": str(out_dir / "checkpoints"),
                       "model_save_format": "safetensors", "save_consolidated": True},
    }
    return config, warmup_steps


def train_command(python: Path, config_path: Path, variant: str, steps: int, warmup_steps: int | None) -> list[str]:
    command = [str(python), str(LAUNCHER), "train", str(config_path), "--variant", variant, "--max-steps",
               str(steps)]
    if warmup_steps is not None:
        command += ["--warmup-steps", str(warmup_steps)]
    return command


_STEP = re.compile(r"step=(\d+) loss=([0-9.eE+-]+|nan|inf)")


def losses(log_text: str) -> list[tuple[int, float]]:
    """(step, loss) of NeMo's `epoch=E step=N loss=L acc=A lr=R` log lines."""
    return [(int(m.group(1)), float(m.group(2))) for m in _STEP.finditer(log_text)]


def export(checkpoints: Path, steps: int, variant: str, out_dir: Path) -> dict:
    """The drafter folder from NeMo's final consolidated checkpoint: its weights as written (hard link, else
    copy), and its config.json with only `architectures` corrected."""
    found = sorted(checkpoints.glob(f"epoch_*_step_{steps}/model/consolidated"))
    if not found:
        raise PeerFailed(f"NeMo wrote no consolidated checkpoint at step {steps} under {checkpoints}")
    source = found[-1]
    index = source / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else sorted(
        p.name for p in source.glob("*.safetensors"))
    if len(files) != 1:
        raise PeerFailed(f"NeMo's export {source} holds {len(files)} weight files; expected one")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    try:
        os.link(source / files[0], out_dir / "model.safetensors")
    except OSError:
        shutil.copyfile(source / files[0], out_dir / "model.safetensors")
    original = json.loads((source / "config.json").read_text())
    (out_dir / "config.nemo.json").write_text(json.dumps(original, indent=1))
    config = dict(original, architectures=[ARCHITECTURES[variant]])
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    return {"export_source": str(source), "export_weights": files[0],
            "config_fixed": {"architectures": [original.get("architectures"), config["architectures"]]}}


def train(row: PeerRow, venv: Path = DEFAULT_VENV) -> tuple[Path, dict]:
    import yaml

    from trainer.atomic import work_lock
    from trainer.data.store import DataStore

    python = require_venv(venv, "bin/python", SETUP)
    if row.options.get("dpace"):
        raise PeerFailed("NeMo Automodel 0.7.0 has no D-PACE (its DFlash loss types: dflash, variable_prefix)")
    store = DataStore.open(row.data_dir)
    data_dir = row.work / f"{PEER}-data"
    with work_lock(data_dir):
        converted = convert_data(store, data_dir, row.target_dir, venv, row.threads)
    run_dir = row.row_dir / "run"
    config, warmup_steps = run_config(row, data_dir / "train.jsonl", converted["samples"],
                                      converted["max_length"], run_dir)
    row.row_dir.mkdir(parents=True, exist_ok=True)
    config_path = row.row_dir / "run.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = train_command(python, config_path, row.variant, row.steps, warmup_steps)
    status, cpu, wall = run_measured(command, row.log, thread_environment(row.threads))
    log_text = row.log.read_text(errors="replace")
    if status:
        tail = "\n".join(log_text.splitlines()[-15:])
        raise PeerFailed(f"NeMo Automodel's trainer exited {status}; {row.log} ends:\n{tail}")
    seen = losses(log_text)
    if not seen or seen[-1][0] != row.steps:
        raise PeerFailed(f"NeMo Automodel logged {seen[-1][0] if seen else 0} of {row.steps} steps; see {row.log}")
    exported = export(run_dir / "checkpoints", row.steps, row.variant, row.row_dir / "export")
    args = config["recipe_args"]
    settings = {
        "aligned": {"taps": list(row.taps), "mask_token_id": row.mask_token_id, "block_size": row.block_size,
                    "layers": row.layers, "batch_size": row.batch_size, "anchors": row.anchors,
                    "steps": row.steps, "threads": row.threads, "schedule": row.schedule},
        "recipe_args": {k: v for k, v in args.items() if k not in ("target_model_name_or_path", "train_data_path",
                                                                    "output_dir")},
        "optimizer": config["optimizer"],
        "warmup_steps": warmup_steps if warmup_steps is not None else max(
            1, int(config["optimizer"]["warmup_ratio"] * row.steps)),
        "precision": "float32 (NeMo's CPU default)",
        "not_aligned": NOT_ALIGNED,
    }
    return row.row_dir / "export", {
        "steps": seen[-1][0], "final_loss": seen[-1][1], "train_cpu_s": round(cpu, 1),
        "train_wall_s": round(wall, 1), "settings": settings, "samples": converted["samples"],
        "data_subset": converted["subset"], "data_candidates": converted["candidates"],
        "data_dropped": converted["dropped"], "template_tail_tokens": converted["template_tail_tokens"],
        "response_tokens": converted["response_tokens"], "peer": f"NeMo Automodel {VERSION}",
        "train_tau_estimate": None, **exported}
