"""The seams the service stands on: one mapping from a JobSpec to the trainer's settings (every field, one
set of defaults shared with `draftsmith run`), one list of stage names, numeric metrics, and stages that stop
when asked (training with a checkpoint) and pick up where they stopped."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner
from test_data import write_prompts
from tiny_targets import make_tiny_target

import trainer.pipeline
from draftsmith.cli import main as cli
from schemas import recipe
from schemas.job_spec import (
    ComputeSpec,
    DataSpec,
    DrafterSpec,
    InitSpec,
    JobSpec,
    TargetSpec,
    TrainingBudget,
    ValidationSpec,
)
from schemas.sampling import SamplingParams
from schemas.stages import STAGE_ORDER, Stage
from trainer.data.prompts import load_prompts
from trainer.data.regenerate import regenerate
from trainer.data.store import DataStore
from trainer.errors import StageInterrupted
from trainer.job_config import run_config_from_spec
from trainer.pipeline import TRAINER_STAGES, RunConfig, step_metrics
from trainer.targets import load_target
from trainer.training.config import TrainConfig
from trainer.training.loop import Trainer

# A valid, non-default value for every field of the spec sections that shape the ML work. A new field
# must be added here (the coverage check below fails otherwise) and mapped in trainer/job_config.py.
CHANGES = {
    "target": {"allow_pickle": True, "trust_remote_code": True},
    "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 80, "seed": 7,
                 "chat_template": {"enable_thinking": False, "system_prompt": "Be brief."}},
    "drafter": {"variant": "dflash", "block_size": 16, "num_layers": 3, "target_layer_ids": [1, 5, 9],
                "mask_token_id": 11},
    "data": {"count": 200, "holdout_share": 0.2, "shard_size": 16},
    "training": {"max_steps": 1234, "max_minutes": 30.0, "learning_rate": 1e-4, "batch_size": 8,
                 "anchors_per_sequence": 32, "checkpoint_every": 50, "zero_stage": 3, "warmup_share": 0.1,
                 "position_weighting": "dpace", "dpace_alpha": 0.3, "acceptance_loss_weight": 0.5,
                 "drafter_adapter": {"rank": 8}},
    "validation": {"prompts": 64, "max_new_tokens": 48, "sampling_draws": 1000},
    "compute": {"device": "cuda:1", "dtype": "float32"},
    "init": {"from_drafter": "file:///drafters/base"},  # a warm start (issue 12): resolved paths map as file:// does
}
SERVICE_ONLY = {"target": {"uri", "base"}, "data": {"source"}}  # resolved to local paths by the caller
MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}
NEEDS = {("training", "drafter_adapter"): {"init": CHANGES["init"]}}  # an adapter trains over a parent


def test_every_spec_field_that_shapes_the_drafter_reaches_the_trainer():
    models = {"target": TargetSpec, "sampling": SamplingParams, "drafter": DrafterSpec, "data": DataSpec,
              "training": TrainingBudget, "validation": ValidationSpec, "init": InitSpec,
              "compute": ComputeSpec}
    for section, model in models.items():
        assert set(model.model_fields) - SERVICE_ONLY.get(section, set()) == set(CHANGES[section]), section
    for section, fields in CHANGES.items():
        for name, value in fields.items():
            start = {**MINIMAL, **NEEDS.get((section, name), {})}
            base = run_config_from_spec(JobSpec.model_validate(start, context={"allowed_file_roots": ["/"]}),
                                        target="t")
            spec = JobSpec.model_validate({**start, section: {**start.get(section, {}), name: value}},
                                          context={"allowed_file_roots": ["/"]})
            assert run_config_from_spec(spec, target="t") != base, f"{section}.{name} does not reach the trainer"


def test_a_rest_job_and_draftsmith_run_train_the_same_drafter_by_default(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--out", str(tmp_path / "out")])
    from_api = run_config_from_spec(JobSpec.model_validate(MINIMAL), target="smollm2-135m")
    assert seen["config"] == from_api == RunConfig(target="smollm2-135m")
    assert from_api.train == TrainConfig() and from_api.train.steps == recipe.TRAIN_STEPS and from_api.train.lr == 2e-3


def test_cli_flags_reach_the_job_spec_and_bad_ones_name_the_field(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--out", str(tmp_path / "a"), "--steps", "50",
                             "--block-size", "16", "--temperature", "0.5"])
    assert (seen["config"].train.steps, seen["config"].block_size, seen["config"].sampling.temperature) == (50, 16, 0.5)
    result = CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--out", str(tmp_path / "b"),
                                      "--block-size", "1"])
    assert result.exit_code == 2 and "drafter.block_size" in result.output


def test_stage_names_have_one_source():
    from domain.states import STAGE_ORDER as API_ORDER
    from domain.states import Stage as ApiStage

    assert ApiStage is Stage and API_ORDER == STAGE_ORDER
    assert list(TRAINER_STAGES) == list(STAGE_ORDER[:-1]) and STAGE_ORDER[-1] is Stage.PUBLISH


def test_training_metrics_reach_the_service_as_numbers_only():
    record = {"step": 3, "loss": 2.5, "lr": 1e-3, "grad_norm": None, "accuracy_per_position": [0.5, 0.25, None],
              "train_tau_estimate": 1.4, "epoch": 0.1}
    assert step_metrics(record) == {"loss": 2.5, "lr": 1e-3, "accuracy_pos_1": 0.5, "accuracy_pos_2": 0.25,
                                    "train_tau_estimate": 1.4, "epoch": 0.1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("seams")
    target = load_target(make_tiny_target(root / "target", "qwen3"))
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=12))
    return target, prompts, root


def test_regeneration_stops_when_asked_and_resumes_from_its_finished_shards(tiny, tmp_path):
    target, prompts, _ = tiny
    params, saved = SamplingParams(max_new_tokens=6), []
    batches = iter(range(100))
    with pytest.raises(StageInterrupted, match="after 4 of 12 prompts"):
        regenerate(target, prompts, params, tmp_path / "d", tap_layer_ids=[1], shard_size=4, batch_size=4,
                   should_stop=lambda: next(batches) >= 1, on_saved=saved.append)
    # Every file is announced once written, a shard's parquet (its completeness mark) after its hidden states.
    assert saved == [tmp_path / "d" / name for name in ("meta.json", "shard-00000.hidden.safetensors",
                                                        "shard-00000.parquet")]
    assert not (tmp_path / "d" / "COMPLETE").exists()
    store = regenerate(target, prompts, params, tmp_path / "d", tap_layer_ids=[1], shard_size=4, batch_size=4)
    assert len(store.examples()) == 12


def test_training_stops_when_asked_with_a_checkpoint_and_resumes_from_it(tiny, tmp_path):
    target, prompts, root = tiny
    data = DataStore.open(root / "data") if (root / "data" / "COMPLETE").exists() else \
        regenerate(target, prompts, SamplingParams(max_new_tokens=6), root / "data", tap_layer_ids=[1, 2])
    config = RunConfig(target=str(target.path), num_layers=1, block_size=4, mask_token_id=7,
                       train=TrainConfig(steps=6, batch_size=2, anchors_per_sequence=2, checkpoint_every=100))
    drafter_config = trainer.pipeline.drafter_config_for(config, target, {"mask_token_id": 7, "tap_layer_ids": [1, 2]})
    steps, saved = [], []
    stop_after = lambda: len(steps) >= 2  # noqa: E731 - asked once per step
    run = Trainer(target, data, tmp_path, drafter_config, config.train, [lambda r: steps.append(r["step"])],
                  should_stop=stop_after, on_saved=saved.append)
    with pytest.raises(StageInterrupted, match="at step 2"):
        run.run()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert tmp_path / "checkpoints" in saved and not (tmp_path / "drafter").exists()
    resumed = []
    Trainer(target, data, tmp_path, drafter_config, config.train, [lambda r: resumed.append(r["step"])]).run(resume=True)
    assert resumed == [3, 4, 5, 6] and (tmp_path / "drafter" / "model.safetensors").is_file()


def test_run_config_survives_its_json_form():
    config = dataclasses.replace(RunConfig(target="t"), target_layer_ids=(1, 2), train=TrainConfig(steps=9))
    assert RunConfig.from_json(config.to_json()) == config
