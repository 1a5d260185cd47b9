"""A training checkpoint records the engine that wrote it (engine.json), and a run on another engine refuses to
resume it with one message: what wrote it, what is resuming, the fix. A checkpoint from before the record is read
by its file names (trainer/training/checkpoint_record.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_data import write_prompts
from test_training import run
from tiny_targets import make_tiny_target

from schemas.sampling import SamplingParams
from schemas.work_files import CheckpointRecord
from trainer.data.prompts import load_prompts
from trainer.data.regenerate import regenerate
from trainer.errors import CheckpointMismatch
from trainer.targets import load_target
from trainer.training import distributed, launch
from trainer.training.checkpoint_record import RECORD_FILE, check_resume, infer_record
from trainer.training.config import TrainConfig

STEPS = 2


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp("target"), "qwen3"))


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=4))
    return regenerate(tiny_target, prompts, SamplingParams(max_new_tokens=16), root / "data", tap_layer_ids=[1, 2, 3])


def config(steps=STEPS):
    return TrainConfig(steps=steps, batch_size=2, anchors_per_sequence=4, checkpoint_every=STEPS, warmup_steps=1)


def record_of(out: Path) -> dict:
    return json.loads((out / "checkpoints" / f"step-{STEPS:06d}" / RECORD_FILE).read_text())


def test_a_plain_checkpoint_is_refused_by_deepspeed_and_resumed_by_the_plain_engine(tiny_target, tiny_data,
                                                                                   tmp_path, monkeypatch):
    run(tiny_target, tiny_data, tmp_path, config())
    assert record_of(tmp_path) == {"version": 1, "engine": "plain", "zero_stage": None, "world_size": 1,
                                   "dtype": "float32", "drafter_adapter_rank": None, "drafter_adapter_alpha": None,
                                   "step": STEPS}
    with monkeypatch.context() as patch:
        patch.setattr(distributed, "wrap", distributed.deepspeed_engine)
        with pytest.raises(CheckpointMismatch) as refused:
            run(tiny_target, tiny_data, tmp_path, config(steps=STEPS + 1), resume=True)
    message = str(refused.value)
    assert refused.value.code == "checkpoint_mismatch"
    assert "written by the plain engine (one process, float32) training every weight" in message
    assert "resumes it with DeepSpeed ZeRO-2 over one process in float32" in message
    assert "differ in engine, zero_stage" in message
    assert "resume on the plain engine: one process (--nproc 1, no hostfile)" in message
    assert f"start over: delete {tmp_path / 'checkpoints'}" in message
    # The same engine resumes as before, and so does a checkpoint from before the record (its state.pt says plain).
    (tmp_path / "checkpoints" / f"step-{STEPS:06d}" / RECORD_FILE).unlink()
    _, resumed = run(tiny_target, tiny_data, tmp_path, config(steps=STEPS + 1), resume=True)
    assert [r["step"] for r in resumed] == [STEPS + 1]


def test_a_deepspeed_checkpoint_is_refused_by_the_plain_engine_and_resumed_by_deepspeed(tiny_target, tiny_data,
                                                                                      tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(distributed, "wrap", distributed.deepspeed_engine)
        run(tiny_target, tiny_data, tmp_path, config())
    assert record_of(tmp_path)["engine"] == "deepspeed" and record_of(tmp_path)["zero_stage"] == 2
    with pytest.raises(CheckpointMismatch, match=r"written by DeepSpeed ZeRO-2 over one process in float32 .* "
                                                 r"resumes it with the plain engine .* resume with DeepSpeed as it was "
                                                 r"written: training.zero_stage=2, one process"):
        run(tiny_target, tiny_data, tmp_path, config(steps=STEPS + 1), resume=True)
    # Without its record (an older checkpoint) DeepSpeed's files say who wrote it: still refused.
    (tmp_path / "checkpoints" / f"step-{STEPS:06d}" / RECORD_FILE).unlink()
    with pytest.raises(CheckpointMismatch, match=r"written by DeepSpeed ZeRO-2 over one process and this run"):
        run(tiny_target, tiny_data, tmp_path, config(steps=STEPS + 1), resume=True)
    monkeypatch.setattr(distributed, "wrap", distributed.deepspeed_engine)
    _, resumed = run(tiny_target, tiny_data, tmp_path, config(steps=STEPS + 1), resume=True)
    assert [r["step"] for r in resumed] == [STEPS + 1]


def deepspeed_files(folder: Path, stage: int, world: int) -> Path:
    folder.mkdir(parents=True)
    for rank in range(world):
        (folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").touch()
        if stage == 3:
            (folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").touch()
    if stage == 2:
        (folder / "mp_rank_00_model_states.pt").touch()
    return folder


@pytest.mark.parametrize("stage", [2, 3])
def test_an_older_deepspeed_checkpoint_is_read_by_its_file_names(tmp_path, stage):
    folder = deepspeed_files(tmp_path / "step-000004", stage, world=2)
    record = infer_record(folder)
    assert (record.engine, record.zero_stage, record.world_size) == ("deepspeed", stage, 2)
    assert record.model_fields_set == {"engine", "zero_stage", "world_size"}  # dtype and adapter: unchecked
    resuming = CheckpointRecord.written(engine="deepspeed", zero_stage=stage, world_size=4, dtype="bfloat16")
    with pytest.raises(CheckpointMismatch, match=r"differ in world_size\); resume with DeepSpeed as it was written: "
                                                 rf"training.zero_stage={stage}, 2 processes \(--nproc 2"):
        check_resume(tmp_path, "step-000004", resuming)
    check_resume(tmp_path, "step-000004", resuming.model_copy(update={"world_size": 2}))
    assert infer_record(tmp_path / "missing") is None


def test_a_drafter_adapter_run_resumes_only_its_own_adapter(tmp_path):
    written = CheckpointRecord.written(engine="plain", zero_stage=None, world_size=1, dtype="float32",
                                       drafter_adapter_rank=8, drafter_adapter_alpha=16, step=4)
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "step-000004" / RECORD_FILE).write_text(json.dumps(written.to_json()))
    full = written.model_copy(update={"drafter_adapter_rank": None, "drafter_adapter_alpha": None, "step": None})
    with pytest.raises(CheckpointMismatch, match=r"training a drafter adapter \(rank 8, alpha 16\) and this run resumes "
                                                 r"it with the plain engine \(one process, float32\) training every "
                                                 r"weight .*training.drafter_adapter rank 8 alpha 16, or start over"):
        check_resume(tmp_path, "step-000004", full)
    check_resume(tmp_path, "step-000004", written.model_copy(update={"step": None}))


def test_an_unreadable_or_empty_checkpoint_is_refused_with_the_way_out(tmp_path):
    (tmp_path / "step-000002").mkdir()
    resuming = CheckpointRecord.written(engine="plain", world_size=1)
    with pytest.raises(CheckpointMismatch, match="holds neither the plain engine's state.pt nor DeepSpeed's files"):
        check_resume(tmp_path, "step-000002", resuming)
    (tmp_path / "step-000002" / RECORD_FILE).write_text('{"version": 1}')
    with pytest.raises(CheckpointMismatch, match="does not say which engine wrote the checkpoint"):
        check_resume(tmp_path, "step-000002", resuming)


def test_a_launched_run_raises_the_ranks_refusal_as_itself(tmp_path, monkeypatch):
    """The ranks cannot raise into the launching process: rank 0 leaves the message in a file, which the launcher
    raises as CheckpointMismatch (not as a crashed launcher with a log tail)."""
    refusal = tmp_path / launch.REFUSAL_FILE
    script = f"from pathlib import Path; Path({str(refusal)!r}).write_text('checkpoint x was written by y'); exit(4)"
    monkeypatch.setattr(launch, "training_command", lambda *args: [sys.executable, "-c", script])
    monkeypatch.setattr(launch, "POLL_SECONDS", 0.01)
    config = SimpleNamespace(to_json=lambda: {})
    with pytest.raises(CheckpointMismatch, match="^checkpoint x was written by y$"):
        launch.train_drafter(config, {}, tmp_path / "data", tmp_path, SimpleNamespace(nproc=2, hostfile=None,
                                                                                      device="cpu"),
                             resume=True, on_step=lambda record: None, should_stop=lambda: False,
                             on_saved=lambda path: None)
