"""A warm start's default training budget is a stated share of a from-scratch job's (schemas/recipe.py
WARM_START_BUDGET_SHARE, schemas/presets.py `specialisation_budget`), from the recipe or a preset, with the same
warm-up share; whatever the job gives is kept."""

from __future__ import annotations

import math

from schemas import recipe
from schemas.job_spec import JobSpec
from schemas.presets import choose_preset

TARGET = {"uri": "bundled:smollm2-135m"}
PARENT = {"from_drafter": "drf_01JQ3ZV8Q7M3W0S9X4T2B6N1C5"}


def test_a_warm_start_trains_a_share_of_a_from_scratch_jobs_budget_by_default():
    scratch = JobSpec.model_validate({"target": TARGET}).training
    warm = JobSpec.model_validate({"target": TARGET, "init": PARENT}).training
    share = recipe.WARM_START_BUDGET_SHARE
    assert (scratch.max_steps, scratch.max_minutes, scratch.warmup_share) == (recipe.TRAIN_STEPS,
                                                                              recipe.TRAIN_MAX_MINUTES, None)
    assert warm.max_steps == math.ceil(recipe.TRAIN_STEPS * share) < scratch.max_steps
    assert warm.max_minutes == recipe.TRAIN_MAX_MINUTES * share
    # The from-scratch schedule's shape: its 30 warm-up steps of 120 become the same share of the fewer steps.
    assert warm.warmup_share == recipe.WARMUP_STEPS / recipe.TRAIN_STEPS


def test_the_jobs_own_training_fields_win_and_the_spec_reads_back_the_same():
    given = JobSpec.model_validate({"target": TARGET, "init": PARENT,
                                    "training": {"max_steps": 77, "max_minutes": None, "learning_rate": 1e-3}})
    assert (given.training.max_steps, given.training.max_minutes, given.training.learning_rate) == (77, None, 1e-3)
    assert given.training.warmup_share is None  # steps of its own: the trainer's fixed warm-up, as from scratch
    minutes_only = JobSpec.model_validate({"target": TARGET, "init": PARENT, "training": {"max_minutes": 3.0}})
    assert (minutes_only.training.max_steps, minutes_only.training.max_minutes) == (30, 3.0)
    warm = JobSpec.model_validate({"target": TARGET, "init": PARENT})
    again = JobSpec.model_validate(warm.model_dump(mode="json"))  # a stored spec is read back without rescaling
    assert again == warm and again.canonical_json() == warm.canonical_json()


def test_a_warm_start_under_a_preset_gets_the_same_share_of_the_presets_budget():
    scratch = choose_preset("gpu", gpu_count=1, target_parameters_billion=1.0, budget_minutes=60)
    warm = choose_preset("gpu", gpu_count=1, target_parameters_billion=1.0, budget_minutes=60, warm_start=True)
    share = recipe.WARM_START_BUDGET_SHARE
    assert warm.fields["training.max_steps"] == math.ceil(scratch.fields["training.max_steps"] * share)
    assert warm.fields["training.max_minutes"] == round(scratch.fields["training.max_minutes"] * share, 3)
    assert warm.fields["training.warmup_share"] == scratch.fields["training.warmup_share"]
    assert warm.fields["data.count"] == scratch.fields["data.count"]  # the data is regenerated as from scratch
    assert "warm start" in warm.notes[-1]
    cpu = choose_preset("cpu", gpu_count=0, warm_start=True).fields
    assert (cpu["training.max_steps"], cpu["training.max_minutes"]) == (30, recipe.TRAIN_MAX_MINUTES * share)


def test_a_rest_warm_start_and_draftsmith_run_of_the_same_spec_train_the_same_budget(monkeypatch, tmp_path):
    import json

    from click.testing import CliRunner

    import trainer.pipeline
    from draftsmith.cli import main as cli
    from trainer.job_config import run_config_from_spec

    body = {"target": TARGET, "init": {"from_drafter": f"file://{tmp_path}/parent"}}
    (tmp_path / "job.json").write_text(json.dumps(body))
    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(cli, ["run", "--spec", str(tmp_path / "job.json"), "--out", str(tmp_path / "out")])
    from_api = run_config_from_spec(JobSpec.model_validate(body, context={"allowed_file_roots": ["/"]}),
                                    target="smollm2-135m")
    assert seen["config"].train == from_api.train
    assert from_api.train.steps == 30 and from_api.train.max_minutes == 1.5
    assert from_api.train.warmup_steps == round(30 * recipe.WARMUP_STEPS / recipe.TRAIN_STEPS)
    assert from_api.parent_name == body["init"]["from_drafter"]  # how the report and the card name the parent
