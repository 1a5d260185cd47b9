"""Issue 12 in the trainer: a drift audit of a drafter against its own target and against another fine-tune of
the same base (made here: a few optimizer steps of the target on other text), a warm start from the earlier
drafter, and the refusals that name what does not fit. Tiny learnable targets: seconds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_data import write_prompts
from tiny_targets import make_tiny_target

from schemas.audit import AuditResult, AuditThresholds
from schemas.sampling import SamplingParams
from trainer.audit import audit_drafter, recommend
from trainer.data.prompts import load_prompts, split_prompts
from trainer.drafter.checkpoint import load_drafter
from trainer.pipeline import Layout, RunConfig, open_job, run_stage
from trainer.targets import load_target
from trainer.training.config import TrainConfig
from trainer.training.init import IncompatibleDrafter, initial_drafter

STAGES = ("prepare", "generate", "train", "validate")


def fine_tune(base: Path, out: Path, *, token: int, steps: int = 30, lr: float = 3e-2) -> Path:
    """A fine-tune: a few AdamW steps of the whole model (embeddings included) on a text of `token` repeated,
    saved with the base's tokenizer. Its greedy answer to anything becomes that token, repeated: something a
    drafter learns in a few dozen steps, and that another fine-tune changes completely."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    text = torch.tensor([[9 + i] + [token] * 15 for i in range(0, 200, 10)])
    for _ in range(steps):
        loss = model(input_ids=text, labels=text).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def small_config(target: Path, prompts: Path, **train) -> RunConfig:
    return RunConfig(target=str(target), sampling=SamplingParams(max_new_tokens=16), prompts=str(prompts),
                     holdout=0.25, variant="dflash", num_layers=1, block_size=4,
                     train=TrainConfig(**{"steps": 40, "batch_size": 4, "anchors_per_sequence": 8, "lr": 1e-2,
                                          "warmup_steps": 2, "checkpoint_every": 1000, **train}),
                     generation_batch_size=16, validation_prompts=6, validation_max_new_tokens=16, sampling_draws=20)


def run_stages(config: RunConfig, work: Path) -> Layout:
    layout = Layout.under(work, work / "out")
    job = open_job(config, layout)
    for stage in STAGES:
        run_stage(stage, config, layout, job=job)
    return layout


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    base = fine_tune(make_tiny_target(root / "random", "qwen3"), root / "base", token=100)
    tuned = fine_tune(base, root / "tuned", token=150)  # another fine-tune of the same base, on other text
    prompts = write_prompts(root / "prompts.jsonl", n=32)
    layout = run_stages(small_config(base, prompts), root / "base-run")
    return {"root": root, "base": base, "tuned": tuned, "prompts": prompts, "layout": layout,
            "report": json.loads(layout.report.read_text())}


def holdout(world, count=6):
    return split_prompts(load_prompts(world["prompts"]), 0.25)[1][:count]


def audit(world, target_dir, **kwargs):
    target = load_target(target_dir)
    return audit_drafter(target, world["layout"].drafter, holdout(world), SamplingParams(max_new_tokens=16),
                         max_new_tokens=16, sampling_draws=20, reference_tau=world["report"]["tau"], **kwargs)


@pytest.fixture(scope="module")
def audits(world):
    # As the audit row stores it (AuditResult.to_json()): the plain object the service answers with.
    return {"own": audit(world, world["base"]).to_json(), "tuned": audit(world, world["tuned"]).to_json()}


def test_an_audit_against_its_own_target_reproduces_validation_and_recommends_keep(world, audits):
    report = audits["own"]
    assert world["report"]["tau"] > 1.2  # the drafter learnt something to lose
    assert report["tau"] == world["report"]["tau"]  # the same measurement on the same prompts
    assert report["tau_per_position"] == world["report"]["tau_per_position"]
    assert report["acceptance_by_category"] == world["report"]["acceptance_by_category"]
    assert report["compatibility"]["fingerprint"]["same"] and report["lossless"]["passed"]
    assert report["recommendation"]["action"] == "keep" and report["recommendation"]["gain_ratio"] == 1.0
    assert report["reference"]["delta"] == 0.0
    assert AuditResult.read(report).version == AuditResult.VERSION


def test_an_audit_against_another_fine_tune_reports_the_drop_and_recommends_a_warm_start(world, audits):
    report = audits["tuned"]
    assert report["lossless"]["passed"]  # lossless whatever the drafter
    assert not report["compatibility"]["fingerprint"]["same"]  # the fine-tune moved the embeddings
    assert report["tau"] < world["report"]["tau"] and report["reference"]["delta"] < 0
    assert report["recommendation"]["action"] in ("warm_start", "retrain")
    assert "acceptance gain" in report["recommendation"]["reason"]
    # The organisation's thresholds decide: a lax rule would still not keep a drafter whose fingerprint changed.
    lax = AuditThresholds(keep_min_gain_ratio=0.0, warm_start_min_gain_ratio=0.0)
    assert recommend(report["tau"], world["report"]["tau"], lossless=True, same_fingerprint=False,
                     thresholds=lax).action == "warm_start"


def test_the_recommendation_follows_the_thresholds():
    rule = AuditThresholds()
    assert recommend(1.3, 1.32, lossless=True, same_fingerprint=True, thresholds=rule).action == "keep"
    assert recommend(1.2, 1.32, lossless=True, same_fingerprint=True, thresholds=rule).action == "warm_start"
    assert recommend(1.05, 1.32, lossless=True, same_fingerprint=True, thresholds=rule).action == "retrain"
    assert recommend(1.32, 1.32, lossless=False, same_fingerprint=True, thresholds=rule).action == "retrain"
    assert recommend(1.5, None, lossless=True, same_fingerprint=True,
                     thresholds=AuditThresholds(min_tau=1.4)).action == "keep"


def test_an_incompatible_drafter_is_refused_naming_the_mismatch(world):
    other = load_target(make_tiny_target(world["root"] / "wide", "qwen3", hidden_size=32))
    with pytest.raises(IncompatibleDrafter, match="hidden size 64 != target's 32"):
        audit_drafter(other, world["layout"].drafter, holdout(world), SamplingParams(), max_new_tokens=8,
                      sampling_draws=20)


def test_a_warm_start_begins_from_the_parent_weights_and_beats_it_on_the_new_target(world):
    parent = world["layout"].drafter
    config = small_config(world["tuned"], world["prompts"], steps=20, init=f"drafter:{parent}")
    layout = run_stages(config, world["root"] / "warm-run")
    prepared = json.loads(layout.prepared.read_text())
    assert prepared["parent_drafter"]["path"] == str(parent)
    base_prepared = json.loads(world["layout"].prepared.read_text())
    assert (prepared["tap_layer_ids"], prepared["mask_token_id"]) == (base_prepared["tap_layer_ids"],
                                                                      base_prepared["mask_token_id"])
    report = json.loads(layout.report.read_text())
    comparison = report["warm_start"]
    assert comparison["tau"] == report["tau"] and comparison["prompts"] == 6
    assert report["tau"] > comparison["parent_tau"]  # trained for the new target, on its data
    warm = load_drafter(layout.drafter)
    assert warm.config.target_fingerprint == load_target(world["tuned"]).fingerprint  # re-recorded

    # Its starting point is the parent, tensor for tensor (the recorded fingerprint aside).
    target = load_target(world["tuned"])
    start = initial_drafter(dataclasses.replace(warm.config, target_fingerprint=target.fingerprint), target, [],
                            f"drafter:{parent}", 0)
    for name, tensor in load_drafter(parent).state_dict().items():
        assert torch.equal(start.state_dict()[name], tensor), name


def test_a_warm_start_of_another_shape_is_refused_before_any_compute(world):
    config = small_config(world["tuned"], world["prompts"], init=f"drafter:{world['layout'].drafter}")
    config = dataclasses.replace(config, num_layers=2)  # a block size, taps or variant of its own are upgrades
    layout = Layout.under(world["root"] / "refused", world["root"] / "refused" / "out")
    with pytest.raises(IncompatibleDrafter, match=r"num_layers is 1 in the parent but 2 here \(set drafter.num_layers "
                                                  r"to 1 or train from scratch\)"):
        run_stage("prepare", config, layout)
    assert not layout.prepared.exists()


def test_draftsmith_audit_runs_the_same_audit_here_and_names_a_mismatch(world, audits):
    from click.testing import CliRunner

    from draftsmith.cli import main as cli

    common = ["audit", "--local", "--prompts", str(world["prompts"]), "--holdout", "0.25", "--num-prompts", "6",
              "--max-new-tokens", "16", "--sampling-draws", "20", "--reference-tau", str(world["report"]["tau"])]
    result = CliRunner().invoke(cli, [*common, "--drafter", str(world["layout"].drafter), "--target",
                                      str(world["base"]), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["result"]["tau"] == audits["own"]["tau"]
    assert printed["result"]["recommendation"]["action"] == "keep"
    wide = make_tiny_target(world["root"] / "wide-cli", "qwen3", hidden_size=32)
    result = CliRunner().invoke(cli, [*common, "--drafter", str(world["layout"].drafter), "--target", str(wide)])
    assert result.exit_code == 4
    assert "incompatible_drafter" in result.stderr and "hidden size 64 != target's 32" in result.stderr
