"""What wrote a training checkpoint, recorded beside it and checked before a run resumes it.

The two engines (distributed.wrap) write different checkpoints in the same place, DIR/TAG with DIR/latest naming the
newest: the plain torch engine of an fp32 world of one (local_engine.py) one `state.pt`, DeepSpeed its
`*_model_states.pt` and one `*_optim_states.pt` per rank, laid out by ZeRO stage. Neither can load the other's,
DeepSpeed's optimizer shards are cut for one stage and world size, a drafter adapter's state holds LoRA weights a
full drafter lacks, and each rank's share of the data follows the world size. Each failed deep inside the engine (a
missing file, `None` for a client state), if at all. So rank 0 writes `engine.json`
(schemas.work_files.CheckpointRecord) into each checkpoint's folder before the engine writes its files and `latest`,
and `check_resume` compares it with the resuming run's own record before the engine loads anything, raising
CheckpointMismatch with both and the fix.

A checkpoint written before the record existed (no engine.json): its engine is read from its file names
(`infer_record`), not refused and not waved through. Refusing would throw away the training of every job in flight
across an upgrade although most resume on the engine that wrote them; waving it through would leave exactly the
mismatch this module exists for. The names tell enough: `state.pt` only the plain engine writes (so also one
process); DeepSpeed's ZeRO-3 alone writes `zero_pp_rank_*_model_states.pt`, and each rank one
`*zero_pp_rank_*_optim_states.pt`. The dtype and the adapter are not in the names: those are left unchecked
(`draftsmith run --resume` refuses changed settings, the adapter among them, on its own).
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError

from schemas.work_files import CheckpointRecord
from trainer.atomic import atomic_write_json
from trainer.errors import CheckpointMismatch
from trainer.training.config import TrainConfig
from trainer.training.local_engine import STATE_FILE, LocalEngine

RECORD_FILE = CheckpointRecord.FILE
PLAIN, DEEPSPEED = "plain", "deepspeed"
CHECKED = ("engine", "zero_stage", "world_size", "dtype", "drafter_adapter_rank", "drafter_adapter_alpha")
"""The fields a resuming run must match, where the checkpoint's record sets them."""


def record_for(engine, world: int, dtype: torch.dtype, cfg: TrainConfig, step: int | None = None) -> CheckpointRecord:
    """The record of a checkpoint this engine writes (or, without a step, of the run that would resume one)."""
    plain = isinstance(engine, LocalEngine)
    rank, alpha = cfg.drafter_adapter or (None, None)
    return CheckpointRecord.written(engine=PLAIN if plain else DEEPSPEED,
                                    zero_stage=None if plain else engine.zero_optimization_stage(), world_size=world,
                                    dtype=str(dtype).removeprefix("torch."), drafter_adapter_rank=rank,
                                    drafter_adapter_alpha=alpha, step=step)


def write_record(folder: Path, record: CheckpointRecord) -> None:
    """Into the checkpoint's folder, before the engine's files (rank 0 only)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / RECORD_FILE, record.to_json())


def read_record(folder: Path) -> CheckpointRecord | None:
    """The checkpoint's record: written, or inferred from its files (module docstring); None for a folder that
    holds neither engine's files."""
    path = folder / RECORD_FILE
    if not path.is_file():
        return infer_record(folder)
    try:
        return CheckpointRecord.load(path)
    except (ValueError, ValidationError) as error:  # ValueError: not JSON; ValidationError: no engine
        raise CheckpointMismatch(f"{path} does not say which engine wrote the checkpoint ({error}); start over: "
                                 f"delete {folder.parent} (a job: submit it again)") from None


def infer_record(folder: Path) -> CheckpointRecord | None:
    """A record-less (older) checkpoint's engine, from the files only that engine writes; only what they tell is
    set, so `check_resume` checks only that."""
    if (folder / STATE_FILE).is_file():
        return CheckpointRecord.model_validate({"engine": PLAIN, "zero_stage": None, "world_size": 1})
    optimizer_shards = list(folder.glob("*zero_pp_rank_*_optim_states.pt"))
    if not optimizer_shards and not list(folder.glob("*model_states.pt")):
        return None
    fields: dict = {"engine": DEEPSPEED, "zero_stage": 3 if list(folder.glob("zero_pp_rank_*_model_states.pt")) else 2}
    if optimizer_shards:
        fields["world_size"] = len(optimizer_shards)
    return CheckpointRecord.model_validate(fields)


def check_resume(checkpoint_dir: Path, tag: str, resuming: CheckpointRecord) -> None:
    """Raise CheckpointMismatch unless the run described by `resuming` can resume checkpoint_dir/tag."""
    folder = checkpoint_dir / tag
    written = read_record(folder)
    if written is None:
        raise CheckpointMismatch(f"{folder} holds neither the plain engine's {STATE_FILE} nor DeepSpeed's files, "
                                 f"though {checkpoint_dir / 'latest'} names it; start over: delete {checkpoint_dir} "
                                 "(a job: submit it again)")
    differ = [name for name in CHECKED if name in written.model_fields_set
              and getattr(written, name) != getattr(resuming, name)]
    if differ:
        raise CheckpointMismatch(
            f"checkpoint {folder} was written by {describe(written)} and this run resumes it with "
            f"{describe(resuming)} (they differ in {', '.join(differ)}); {_fix(written)}, or start over: delete "
            f"{checkpoint_dir} (a job: submit it again as a fresh job)")


def describe(record: CheckpointRecord) -> str:
    """E.g. 'DeepSpeed ZeRO-2 over 2 processes in bfloat16' or 'the plain engine (one process, float32)', with
    an adapter's rank and alpha where the record has them."""
    known = record.model_fields_set
    if record.engine == PLAIN:
        words = "the plain engine (one process" + (f", {record.dtype})" if record.dtype else ")")
    else:
        words = "DeepSpeed" if record.engine == DEEPSPEED else f"engine {record.engine!r}"
        if record.zero_stage is not None:
            words += f" ZeRO-{record.zero_stage}"
        if record.world_size is not None:
            words += f" over {_processes(record.world_size)}"
        if record.dtype is not None:
            words += f" in {record.dtype}"
    if "drafter_adapter_rank" in known:
        words += (" training every weight" if record.drafter_adapter_rank is None else
                  f" training a drafter adapter (rank {record.drafter_adapter_rank}, alpha "
                  f"{record.drafter_adapter_alpha})")
    return words


def _fix(written: CheckpointRecord) -> str:
    """How to resume the way the checkpoint was written."""
    if written.engine == PLAIN:
        how = ("resume on the plain engine: one process (--nproc 1, no hostfile) with "
               f"{written.dtype or 'float32'} weights (bfloat16 weights run on DeepSpeed)")
    elif written.engine == DEEPSPEED:
        how = "resume with DeepSpeed as it was written"
        if written.zero_stage is not None:
            how += f": training.zero_stage={written.zero_stage}"
        if written.world_size is not None:
            how += f", {_processes(written.world_size)} (--nproc {written.world_size} or the same hostfile)"
        if written.dtype is not None:
            how += f", {written.dtype} weights"
    else:
        return f"resume with the engine that wrote it ({written.engine})"
    if "drafter_adapter_rank" in written.model_fields_set:
        how += (", no training.drafter_adapter" if written.drafter_adapter_rank is None else
                f", training.drafter_adapter rank {written.drafter_adapter_rank} alpha "
                f"{written.drafter_adapter_alpha}")
    return how


def _processes(world: int) -> str:
    return "one process" if world == 1 else f"{world} processes"
