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
from schemas.sampling import ChatTemplateOptions, SamplingParams
from schemas.validation_report import ValidationReport
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
    # The mode it was measured in is the job's own (greedy, the template's default thinking, no system prompt).
    assert report["serving_mode"] == world["report"]["serving_mode"]
    assert (report["serving_mode"]["temperature"], report["serving_mode"]["has_system_prompt"]) == (0.0, False)


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
    # Before and after on the same prompts: the new drafter's figures are the report's own, the parent's carry
    # their intervals, and the advice follows the paired gain's interval (a greedy job: T=0 is its temperature).
    assert comparison["tau_greedy"] == report["tau_greedy"]
    assert comparison["parent_tau_greedy"]["tau"] == comparison["parent_tau"]
    low, high = comparison["parent_tau_greedy"]["ci95"]
    assert low <= comparison["parent_tau"] <= high
    assert comparison["parent_tau_sampled"]["same_as_greedy"] is True
    gain = comparison["gain_sampled"]
    assert gain == comparison["gain_greedy"] and gain["ratio"] == round(report["tau"] / comparison["parent_tau"], 4)
    assert gain["ci95"][0] <= gain["ratio"] <= gain["ci95"][1]
    assert comparison["advice"] == ("serve_new" if gain["ci95"][0] > 1 else "keep_parent")
    assert comparison["parent"]["name"] == str(parent)
    assert comparison["serving_mode"] == report["serving_mode"]
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


def test_a_warm_start_served_with_sampling_and_a_system_prompt_is_judged_in_that_mode(world):
    """Regenerated, trained, and judged (parent and new drafter alike) at the served temperature with the served
    system prompt; report.json, report.html and the model card say so, and say which drafter to serve."""
    from report.html import render_report_html
    from trainer.export.model_card import _serving_mode_line, _warm_start
    from trainer.validation.report import SamplingInconclusive

    served = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16,
                            chat_template=ChatTemplateOptions(enable_thinking=False, system_prompt="Be brief."))
    parent = world["layout"].drafter
    config = dataclasses.replace(small_config(world["tuned"], world["prompts"], steps=20, init=f"drafter:{parent}"),
                                 sampling=served, engines=())
    layout = Layout.under(world["root"] / "served-run", world["root"] / "served-run" / "out")
    job = open_job(config, layout)
    for stage in STAGES[:-1]:
        run_stage(stage, config, layout, job=job)
    try:
        run_stage("validate", config, layout, job=job)
    except SamplingInconclusive:  # the tiny fine-tune answers near-deterministically: little for the test to test
        pass  # report.json is written before the verdict, with every figure below
    report = ValidationReport.load(layout.report)
    warm = report.warm_start
    assert report.serving_mode.has_system_prompt and report.serving_mode.enable_thinking is False
    assert report.serving_mode.temperature == 0.7 and warm.serving_mode == report.serving_mode
    assert warm.parent_tau_greedy.temperature == 0.0 and warm.parent_tau_sampled.temperature == 0.7
    assert warm.parent_tau_sampled.same_as_greedy is False and warm.parent_tau == warm.parent_tau_sampled.tau
    assert warm.tau_sampled.to_json() == report.tau_sampled.to_json() and warm.tau == report.tau
    assert warm.gain_sampled.temperature == 0.7 and warm.gain_greedy.temperature == 0.0
    assert warm.advice == ("serve_new" if warm.gain_sampled.ci95[0] > 1 else "keep_parent")

    card = _serving_mode_line(report) + _warm_start(report)
    page = render_report_html(report, [])
    mode = report.serving_mode.summary()
    assert f"every tau below measured, in this mode: {mode}" in card
    assert "## Warm start: the parent against this drafter" in card and f"`{parent}`" in card
    verdict = "**Keep serving the parent:**" if warm.keep_parent else "**Serve this drafter:**"
    assert verdict in card and "| T=0.7, top-p 0.9, top-k 0 (the job's) |" in card
    assert f'data-advice="{warm.advice}"' in page and 'id="warm-start"' in page and mode in page
