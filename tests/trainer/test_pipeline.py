"""`draftsmith run` end to end on a small BPE target: every stage, the artifact layout, resume, and the
compatibility checks of validate/export. (The real SmolLM2 run is the README's main job.)"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from tiny_targets import make_bpe_target

import trainer.validation.report
from draftsmith.cli import main as cli
from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import load_drafter, save_drafter
from trainer.errors import DraftsmithError
from trainer.export.artifacts import verify_manifest
from trainer.pipeline import TRAINER_STAGES as STAGES
from trainer.pipeline import Run, RunConfig
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.training.config import TrainConfig
from trainer.validation.report import check_compatible

REPORT_KEYS = {"tau", "tau_per_position", "acceptance_by_category", "oracle_tau", "block_size",
               "recommended_block_size", "lossless", "speedup", "sampling_parameters"}


def small_run_config(target_dir) -> RunConfig:
    return RunConfig(
        target=str(target_dir), sampling=SamplingParams(max_new_tokens=16), num_prompts=40, holdout=0.2, num_layers=1,
        block_size=4, train=TrainConfig(steps=8, batch_size=4, anchors_per_sequence=4, checkpoint_every=4),
        generation_batch_size=8, validation_prompts=3, validation_max_new_tokens=12, sampling_draws=40,
        engines=(),  # the engine step has its own tests (tests/engines/)
    )


@pytest.fixture(scope="module")
def bpe_target_dir(tmp_path_factory):
    return make_bpe_target(tmp_path_factory.mktemp("bpe-target"), num_layers=6)


@pytest.fixture(scope="module")
def finished_run(bpe_target_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    stages_seen = []
    state = Run(small_run_config(bpe_target_dir), out, lambda stage, fraction, detail: stages_seen.append(stage)
                ).execute()
    return out, state, stages_seen


def test_run_produces_the_artifact_layout(finished_run):
    out, state, stages_seen = finished_run
    assert list(dict.fromkeys(stages_seen)) == list(STAGES)
    assert all(state["stages"][stage]["done"] for stage in STAGES)
    for name in ("drafter/config.json", "drafter/model.safetensors", "gguf/drafter-f16.gguf",
                 "gguf/drafter-q8_0.gguf", "README.md", "report.json", "metrics.jsonl", "report.html",
                 "drafter-record.json", "manifest.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "manifest.json").read_text())
    # The default recipe drafts over a draft vocabulary (this target has SmolLM2's 49k tokens): the drafter as vLLM
    # reads one (drafter-d2t/) and the llama.cpp GGUF that reads it come beside the full-head files.
    assert set(manifest["files"]) == {"drafter/config.json", "drafter/model.safetensors", "gguf/drafter-f16.gguf",
                                      "gguf/drafter-q8_0.gguf", "README.md", "report.json", "metrics.jsonl",
                                      "report.html", "drafter-d2t/config.json", "drafter-d2t/model.safetensors",
                                      "gguf/drafter-q8_0-d2t.gguf", "drafter-record.json"}
    assert verify_manifest(out) == []
    (out / "README.md").write_text((out / "README.md").read_text() + "tampered")
    assert verify_manifest(out) == ["README.md: content differs from the manifest"]


def test_report_proves_losslessness_and_carries_every_figure(finished_run):
    out, _, _ = finished_run
    report = json.loads((out / "report.json").read_text())
    assert REPORT_KEYS <= set(report)
    # The timed subset (a third of the prompts, at least 2) is decoded speculatively and checked token for token.
    greedy = report["lossless"]["greedy"]
    assert {k: greedy[k] for k in ("prompts", "mismatches", "first_divergence", "block_size")} == {
        "prompts": 2, "mismatches": 0, "first_divergence": None, "block_size": report["recommended_block_size"]}
    assert greedy["tokens"] > 0 and report["prompts"] == 3 and report["speedup"]["prompts"] == 2
    assert set(report["lossless"]["sampling"]) >= {"test", "p_value", "draws"}
    assert set(report["speedup"]) >= {"ar_tokens_per_s", "spec_tokens_per_s", "ratio"}
    assert len(report["tau_per_position"]) == 3 and 1.0 <= report["tau"] <= 4.0
    assert 2 <= report["recommended_block_size"] <= 4
    # Costs are measured per draft length, separately; the exported drafter records the recommended one.
    assert set(report["step_costs_ms"]["draft"]) == set(report["estimated_speedup_by_block_size"])
    assert set(report["step_costs_ms"]["verify"]) == {"1", *report["estimated_speedup_by_block_size"]}  # JSON keys
    exported = json.loads((out / "drafter" / "config.json").read_text())
    assert exported["draftsmith"]["recommended_block_size"] == report["recommended_block_size"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 9)) and all("loss" in m for m in metrics)
    card = (out / "README.md").read_text()
    assert "--speculative-num-draft-tokens" in card and '"num_speculative_tokens"' in card
    assert "--spec-type draft-dflash" in card


def test_export_writes_the_drafters_record_once(finished_run):
    """drafter-record.json (trainer/export/record.py): the shape of the exported drafter's config, the report's
    headline figures, and the serving flags the model card's commands carry, at the recommended block."""
    from schemas.lineage import DrafterRecord
    from trainer.drafter.config import DrafterConfig

    out, _, _ = finished_run
    record = DrafterRecord.load(out / DrafterRecord.FILE)
    assert record.version == DrafterRecord.VERSION
    config = DrafterConfig.from_hf_dict(json.loads((out / "drafter" / "config.json").read_text()))
    assert (record.shape.hidden_size, record.shape.vocab_size, record.shape.target_layer_ids,
            record.shape.mask_token_id) == (config.hidden_size, config.vocab_size, list(config.target_layer_ids),
                                            config.mask_token_id)
    report = json.loads((out / "report.json").read_text())
    assert record.metrics.tau == report["tau"] and record.metrics.recommended_block_size == report["recommended_block_size"]
    assert record.metrics.lossless_passed is True and record.target_fingerprint == report["target_fingerprint"]
    serving, card = record.metrics.serving, (out / "README.md").read_text()
    assert serving is not None and serving.sglang in card and serving.llama_cpp in card
    assert serving.vllm == {"method": "dflash", "num_speculative_tokens": report["recommended_block_size"] - 1}


def test_exported_drafter_decodes_identically_in_the_reference(finished_run, bpe_target_dir, reference_dflash):
    out, _, _ = finished_run
    target = load_target(bpe_target_dir)
    drafter = load_drafter(out / "drafter")
    reference = reference_dflash.DFlash2DraftModel.from_pretrained(out / "drafter", dtype=torch.float32).eval()
    prompt = target.tokenizer("Hello there, how are you today?")["input_ids"]
    ours = SpeculativeDecoder(target, drafter).generate(prompt, SamplingParams(max_new_tokens=20))
    theirs = reference_dflash.dflash_generate(reference, target.model, torch.tensor([prompt]), 20,
                                              target.stop_token_ids(), return_stats=True)
    assert ours.tokens == theirs.output_ids[0, len(prompt):].tolist()
    assert ours.acceptance_lengths == theirs.acceptance_lengths


def test_resume_skips_finished_stages(bpe_target_dir, tmp_path, monkeypatch):
    config = small_run_config(bpe_target_dir)

    def broken_validate(*args, **kwargs):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(trainer.validation.report, "validate", broken_validate)
    with pytest.raises(RuntimeError, match="worker killed"):
        Run(config, tmp_path).execute()
    state = json.loads((tmp_path / ".work" / "state.json").read_text())
    assert set(state["stages"]) == {"prepare", "generate", "train"}
    assert not (tmp_path / "manifest.json").exists()  # nothing half-exported
    with pytest.raises(DraftsmithError, match="already holds a run; pass --resume"):
        Run(config, tmp_path).execute()
    with pytest.raises(DraftsmithError, match="different settings"):
        Run(RunConfig(**{**config.__dict__, "block_size": 8}), tmp_path).execute(resume=True)
    monkeypatch.undo()
    # A run begun by an older Draftsmith, before some settings existed, resumes (they compare as their defaults).
    state_file = tmp_path / ".work" / "state.json"
    state = json.loads(state_file.read_text())
    del state["config"]["train"]["first_failure_only"], state["config"]["train"]["train_on_draft_vocab"]
    state_file.write_text(json.dumps(state))
    seen = []
    Run(config, tmp_path, lambda stage, fraction, detail: seen.append((stage, detail))).execute(resume=True)
    assert ("train", "done earlier") in seen and ("generate", "done earlier") in seen
    assert (tmp_path / "manifest.json").is_file()


def test_validate_refuses_a_drafter_built_for_another_target(finished_run, tmp_path):
    out, _, _ = finished_run
    other = load_target(make_bpe_target(tmp_path / "other", num_layers=6, seed=1))
    drafter = load_drafter(out / "drafter")
    with pytest.raises(DraftsmithError, match="target fingerprint"):
        check_compatible(other, drafter)
    narrower = load_target(make_bpe_target(tmp_path / "narrow", hidden_size=32, num_layers=6))
    with pytest.raises(DraftsmithError, match="hidden size 64 != target's 32"):
        check_compatible(narrower, drafter)
    shallower = load_target(make_bpe_target(tmp_path / "shallow", num_layers=4))
    with pytest.raises(DraftsmithError, match="-layer target; this target has 4 layers"):
        check_compatible(shallower, drafter)
    result = CliRunner().invoke(cli, ["validate", "--target", str(tmp_path / "other"), "--drafter",
                                      str(out / "drafter"), "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "built for another target" in result.output
    assert not (tmp_path / "r.json").exists()


def test_export_needs_the_target(finished_run, tmp_path):
    out, _, _ = finished_run
    result = CliRunner().invoke(cli, ["export", "--target", str(tmp_path / "gone"), "--drafter",
                                      str(out / "drafter"), "--out", str(tmp_path / "artifacts")])
    assert result.exit_code == 2 and "target directory" in result.output and "is missing" in result.output
    assert not (tmp_path / "artifacts").exists()


def test_export_failure_leaves_no_manifest(finished_run, bpe_target_dir, tmp_path, monkeypatch):
    import trainer.export.artifacts as artifacts

    out, _, _ = finished_run

    def failing_gguf(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(artifacts, "write_gguf", failing_gguf)
    with pytest.raises(OSError):
        artifacts.export_artifacts(out / "drafter", load_target(bpe_target_dir), tmp_path / "a")
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_saving_is_atomic(tmp_path, finished_run):
    out, _, _ = finished_run
    drafter = load_drafter(out / "drafter")
    save_drafter(drafter, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
