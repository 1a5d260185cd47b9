"""Issue 35 part 3: recipe presets (schemas/presets.py). The cpu preset is today's main job, constant for constant;
the gpu preset is the published DFlash recipe sized by a budget; both are laid under what the user gives; and
`draftsmith run --preset` reaches the run config (checked without running the job)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import trainer.pipeline
from draftsmith.cli import main as cli
from schemas import recipe
from schemas.job_spec import JobSpec
from schemas.presets import CPU_FIELDS, choose_preset, lay_under, preset_fields
from trainer.job_config import run_config_from_spec
from trainer.pipeline import RunConfig
from trainer.training.blocks import default_decay_gamma
from trainer.training.config import TrainConfig

MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


def test_auto_is_the_cpu_without_a_gpu_and_the_gpu_recipe_with_one():
    assert choose_preset("auto", gpu_count=0).name == "cpu"
    assert choose_preset("auto", gpu_count=1).name == "gpu"
    assert choose_preset("auto", gpu_count=8).name == "gpu"
    assert choose_preset("cpu", gpu_count=8).name == "cpu"  # asked for, whatever the machine
    assert choose_preset("gpu", gpu_count=0).name == "gpu"  # planned as one device (a dry run on a CPU)
    with pytest.raises(ValueError, match="preset 'tpu' is not one of auto, cpu, gpu"):
        choose_preset("tpu", gpu_count=0)


def test_the_cpu_preset_is_todays_recipe_constant_for_constant():
    assert CPU_FIELDS == {
        "drafter.variant": recipe.VARIANT, "drafter.num_layers": 2, "drafter.block_size": 8,
        "sampling.max_new_tokens": 128, "training.max_steps": 120, "training.max_minutes": 6.0,
        "training.learning_rate": 2e-3, "training.batch_size": 16, "training.anchors_per_sequence": 12,
        "validation.prompts": 12, "validation.max_new_tokens": 64, "validation.sampling_draws": 300}
    preset = choose_preset("cpu", gpu_count=0)
    assert preset.fields == CPU_FIELDS and preset.generation_batch_size == 32
    laid = JobSpec.model_validate(lay_under(MINIMAL, preset.fields))
    assert laid == JobSpec.model_validate(MINIMAL)
    assert laid.canonical_json() == JobSpec.model_validate(MINIMAL).canonical_json()  # stored jobs keep their hash
    assert run_config_from_spec(laid, target="smollm2-135m") == RunConfig(target="smollm2-135m")


def test_the_gpu_preset_is_the_published_recipe_and_validates_as_a_job_spec():
    fields = preset_fields("gpu", gpu_count=1, target_parameters_billion=0.135)
    spec = JobSpec.model_validate(lay_under(MINIMAL, fields))
    assert (spec.drafter.num_layers, spec.drafter.block_size, spec.training.anchors_per_sequence) == (5, 16, 512)
    assert (spec.training.learning_rate, spec.training.warmup_share, spec.sampling.max_new_tokens) == (6e-4, 0.04, 512)
    assert spec.training.max_minutes is None and spec.data.count == 640  # unbudgeted: every built-in prompt
    train_prompts = 640 - int(640 * recipe.HOLDOUT_SHARE)
    assert spec.training.max_steps == -(-6 * train_prompts // 8)  # 6 epochs of the regenerated samples
    config = run_config_from_spec(spec, target="smollm2-135m")
    assert config.train.warmup_steps == round(0.04 * spec.training.max_steps)
    assert config.train.grad_clip == 1.0 and default_decay_gamma(config.block_size) == 7.0
    assert "warmup_share" in json.loads(spec.canonical_json())["training"]


def test_a_budget_scales_the_gpu_preset_to_minutes():
    small = preset_fields("gpu", target_parameters_billion=0.135, budget_minutes=6)
    assert small["training.max_minutes"] == pytest.approx(recipe.GPU_TRAIN_SHARE * 6)
    big = preset_fields("gpu", target_parameters_billion=70, budget_minutes=6)
    assert big["data.count"] == recipe.GPU_MIN_PROMPTS < small["data.count"]  # a slower target affords fewer
    assert big["training.max_steps"] < small["training.max_steps"]
    one = preset_fields("gpu", gpu_count=1, budget_minutes=600, source_prompts=200)
    many = preset_fields("gpu", gpu_count=8, budget_minutes=600, source_prompts=200)
    assert one["data.count"] == many["data.count"] == 200
    assert many["training.max_steps"] == -(-one["training.max_steps"] // 8)  # 8 GPUs share each epoch
    assert preset_fields("gpu", budget_minutes=60, source_prompts=100)["data.count"] == 100
    with pytest.raises(ValueError, match="budget_minutes must be positive"):
        preset_fields("gpu", budget_minutes=0)


def test_what_the_user_gives_wins_over_the_preset():
    fields = preset_fields("gpu", budget_minutes=6)
    body = {**MINIMAL, "training": {"max_steps": 7, "max_minutes": None}, "sampling": {"temperature": 0.5}}
    laid = lay_under(body, fields)
    assert laid["training"]["max_steps"] == 7 and laid["training"]["max_minutes"] is None  # a given null wins too
    assert laid["training"]["anchors_per_sequence"] == 512 and laid["sampling"] == {"temperature": 0.5,
                                                                                      "max_new_tokens": 512}
    assert body["training"] == {"max_steps": 7, "max_minutes": None}  # not modified in place


def test_a_spec_without_the_new_field_keeps_its_canonical_json():
    spec = JobSpec.model_validate(MINIMAL)
    assert "warmup_share" not in json.loads(spec.canonical_json())["training"]
    assert run_config_from_spec(spec, target="t").train.warmup_steps == TrainConfig().warmup_steps == 30
    with pytest.raises(ValueError, match="warmup_share"):
        JobSpec.model_validate({**MINIMAL, "training": {"warmup_share": 1.5}})


@pytest.fixture
def run_config(monkeypatch, tmp_path):
    """`draftsmith run ARGS` up to the run config it would execute (the job itself never runs)."""
    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))

    def invoke(*args: str) -> RunConfig:
        seen.clear()
        result = CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--out", str(tmp_path / "o"), *args])
        assert "config" in seen, result.output
        return seen["config"]
    return invoke


def test_draftsmith_run_preset_gpu_reaches_the_run_config(run_config):
    config = run_config("--preset", "gpu", "--device", "cuda", "--budget-minutes", "6")
    assert (config.num_layers, config.block_size, config.train.anchors_per_sequence) == (5, 16, 512)
    assert (config.train.lr, config.sampling.max_new_tokens, config.generation_batch_size) == (6e-4, 512, 128)
    expected = preset_fields("gpu", target_parameters_billion=0.135, budget_minutes=6)
    assert config.train.max_minutes == pytest.approx(2.4) and config.device == "cuda"
    assert (config.num_prompts, config.train.steps) == (expected["data.count"], expected["training.max_steps"])
    assert config.train.warmup_steps == round(0.04 * config.train.steps)
    # flags win over the preset, typed sampling flags too
    flagged = run_config("--preset", "gpu", "--steps", "9", "--anchors", "4", "--max-new-tokens", "32",
                         "--generation-batch-size", "8")
    assert (flagged.train.steps, flagged.train.anchors_per_sequence, flagged.sampling.max_new_tokens,
            flagged.generation_batch_size, flagged.block_size) == (9, 4, 32, 8, 16)


def test_draftsmith_run_defaults_to_the_cpu_preset_and_auto_follows_the_gpus(run_config, monkeypatch):
    assert run_config() == run_config("--preset", "cpu") == RunConfig(target="smollm2-135m")
    assert run_config("--preset", "auto") == RunConfig(target="smollm2-135m")  # no GPU here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert run_config("--preset", "auto").block_size == 16
    assert run_config("--preset", "auto", "--device", "cpu").block_size == 8  # a CPU job keeps the CPU recipe
