"""The typed work files (schemas/work_files.py), the drafter record (schemas/lineage.py) and the audit result
(schemas/audit.py): each model round-trips a well-formed file, reads a file written before it had a `version`,
and drops a field of the wrong type instead of failing. Pure pydantic: no torch, no database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.audit import AuditResult
from schemas.lineage import DrafterLineage, DrafterMetrics, DrafterShape
from schemas.validation_report import MeasuredFigures, ValidationReport
from schemas.work_files import (
    DataMeta,
    LenientModel,
    PinnedSources,
    PreparedTarget,
    StageMarker,
    StepRecord,
    VersionedFile,
)

SAMPLE_REPORT = Path(__file__).parent / "dashboard" / "data" / "sample_job" / "report.json"
SOURCES = {"target": {"uri": "hf://acme/llama@main", "revision": "abc", "pinned_uri": "hf://acme/llama@abc"},
           "prompts": {"uri": "builtin", "revision": None, "pinned_uri": "builtin"}}
PREPARED = {"target_path": "/models/llama", "fingerprint": "sha256:ff", "adapter_path": None, "mask_token_id": 7,
            "mask_token_rule": "given", "tap_layer_ids": [1, 2], "train_prompts": 90, "holdout_prompts": 10,
            "parent_drafter": {"path": "/drafters/p", "target_fingerprint": "sha256:ee"}}
TRAIN_MARKER = {"steps": 40, "planned_steps": 40, "final_loss": 2.5, "train_tau_estimate": 1.4,
                "device": {"device": "cpu"}, "environment": {"draftsmith": "0.1.0", "packages": {"torch": "2.5"}}}
LINEAGE = {"target": SOURCES["target"], "data": {"source": "builtin", "count": 100, "snapshot": {"files": 3}},
           "parent": None, "recipe": {"training": {"max_steps": 4}}, "code": {"draftsmith": "0.1.0"},
           "training": {"steps": 40, "final_loss": 2.5, "train_tau_estimate": 1.4}}
METRICS = {"tau": 1.5, "tau_per_position": [0.9, None], "acceptance_by_category": {"chat": {"tau": 1.5, "cycles": 9}},
           "lossless_passed": True, "greedy_mismatches": 0, "sampling_p_value": 0.4, "recommended_block_size": 3,
           "serving": {"sglang": "--x 3", "vllm": {"method": "dflash", "num_speculative_tokens": 2}}}
SHAPE = {"hidden_size": 576, "vocab_size": 49152, "num_target_layers": 30, "target_layer_ids": [1, 14, 27],
         "mask_token_id": 16, "architecture": "DFlashDraftModel"}
AUDIT = {"compatible": True, "compatibility": {"fingerprint": {"drafter": None, "target": "sha256:ff", "same": True},
                                               "hidden_size": {"drafter": 576, "target": 576, "ok": True}},
         "lossless": {"passed": True, "greedy": {"mismatches": 0}, "sampling": {"p_value": 0.3}},
         "tau": 1.4, "tau_per_position": [0.8, 0.4], "acceptance_by_category": {"chat": {"tau": 1.4}},
         "reference": {"tau": 1.5, "source": "given", "delta": -0.1},
         "recommendation": {"action": "warm_start", "reason": "keeps 80%", "gain_ratio": 0.8, "thresholds": {}},
         "prompts": 6, "tokens_generated": 900, "minutes": 0.2, "drafter_revision": "r1"}

# (model, a well-formed file as the code wrote it before `version`, a field of the wrong type for it)
FILES = [
    (PinnedSources, SOURCES, ("target", "hf://not-an-object")),
    (PreparedTarget, PREPARED, ("tap_layer_ids", "all of them")),
    (StageMarker, TRAIN_MARKER, ("steps", "many")),
    (DrafterLineage, LINEAGE, ("training", ["not", "an", "object"])),
    (DrafterMetrics, METRICS, ("tau", "high")),
    (DrafterShape, SHAPE, ("target_layer_ids", {"a": 1})),
    (AuditResult, AUDIT, ("recommendation", "keep")),
]
IDS = [model.__name__ for model, _, _ in FILES]


@pytest.mark.parametrize(("model", "old", "bad"), FILES, ids=IDS)
def test_a_well_formed_file_round_trips_with_its_version(model, old, bad, tmp_path):
    written = model.written(**old)
    assert written.version == model.VERSION
    path = tmp_path / "file.json"
    path.write_text(json.dumps(written.to_json()))
    again = model.load(path)
    assert again.to_json() == written.to_json() == {"version": model.VERSION, **old}
    assert again == written


@pytest.mark.parametrize(("model", "old", "bad"), FILES, ids=IDS)
def test_an_unversioned_file_reads_as_version_1_as_it_was(model, old, bad):
    read = model.read(old)
    assert read.version == 1 and read.to_json() == old  # nothing added, nothing lost: written again as it was


@pytest.mark.parametrize(("model", "old", "bad"), FILES, ids=IDS)
def test_a_field_of_the_wrong_type_is_dropped_not_fatal(model, old, bad):
    name, value = bad
    read = model.read({**old, name: value, "added_by_a_newer_writer": {"kept": True}})
    assert getattr(read, name) is None
    assert read.to_json() == {**{k: v for k, v in old.items() if k != name}, "added_by_a_newer_writer": {"kept": True}}


def test_a_bad_version_or_no_object_reads_as_an_empty_file():
    assert PreparedTarget.read({"version": "two", "mask_token_id": 3}).to_json() == {"mask_token_id": 3}
    for nothing in (None, [1, 2], "text"):
        assert StageMarker.read(nothing).to_json() == {}


def test_the_writer_is_strict_where_the_reader_is_lenient():
    with pytest.raises(ValueError):
        StageMarker.written(steps="many")


def test_the_validation_report_shares_the_one_lenient_reader():
    """report.json reads by the same rule, from the same place (no second copy of the loop to drift)."""
    assert issubclass(ValidationReport, LenientModel) and not issubclass(ValidationReport, VersionedFile)
    assert ValidationReport.read is not None and "read" not in ValidationReport.__dict__
    assert ValidationReport.read({"tau": "x", "prompts": 3}).to_json() == {"prompts": 3}


def test_a_stage_summary_comes_back_without_the_files_version():
    marker = StageMarker.read({**TRAIN_MARKER, "version": 1})
    assert marker.summary() == TRAIN_MARKER
    assert marker.environment is not None and marker.environment.packages == {"torch": "2.5"}


def test_the_audit_result_answers_its_verdict_even_when_sections_are_missing():
    read = AuditResult.read({"lossless": "??", "recommendation": {"action": "retrain"}})
    assert (read.action, read.passed) == ("retrain", False)
    assert AuditResult.read(AUDIT).passed and AuditResult.read(AUDIT).action == "warm_start"


def test_an_audit_carries_report_jsons_figures_as_report_json_writes_them():
    """The audit's figures are validation's own fields: built from a report, they give back report.json's JSON."""
    report = ValidationReport.read(json.loads(SAMPLE_REPORT.read_text()))
    audit = AuditResult.measured(report, compatible=True)
    shared = {name: value for name, value in report.to_json().items() if name in MeasuredFigures.model_fields}
    shared["lossless"] = {**shared["lossless"], "passed": report.passed}  # the audit's verdict sits in its section
    assert len(shared) >= 8 and {name: audit.to_json()[name] for name in shared} == shared
    assert audit.speedup == report.speedup and audit.speedup is not None and audit.speedup.ratio_ci95
    assert audit.passed and audit.lossless is not None and audit.lossless.greedy == report.greedy
    metrics = DrafterMetrics.read(report.to_json())  # the drafter's metrics hold the acceptance figures the same way
    assert (metrics.tau, metrics.acceptance_by_category) == (report.tau, report.acceptance_by_category)


DATA_META = {"target_fingerprint": "sha256:ff", "sampling": {"temperature": 0.0, "max_new_tokens": 64},
             "tap_layer_ids": [1, 3], "hidden_cached": True, "hidden_dtype": "bfloat16", "shard_size": 256,
             "prompt_ids": ["a", "b"], "plan": "2 prompts ... -> cache them with the data"}


def test_data_meta_written_before_its_version_reads_and_resumes_as_it_was():
    old = DataMeta.read(DATA_META)
    assert old.version == 1 and old.to_json() == DATA_META and old.teacher_top_k is None
    assert old.differs_from(DataMeta.written(**DATA_META)) == []
    assert old.differs_from(DataMeta.written(**{**DATA_META, "shard_size": 128, "plan": "other"})) == ["shard_size"]


@pytest.mark.parametrize("missing", DataMeta.IDENTITY)
def test_data_meta_without_a_field_its_writer_always_writes_is_an_error(missing):
    with pytest.raises(ValidationError):
        DataMeta.read({k: v for k, v in DATA_META.items() if k != missing})
    with pytest.raises(ValidationError):
        DataMeta.written(**{k: v for k, v in DATA_META.items() if k != missing})


STEP = {"step": 3, "loss": 2.5, "ce": 2.4, "lr": 1e-4, "accuracy_per_position": [0.5, 0.25], "train_tau_estimate": 1.4,
        "tokens_per_s": 900.0, "epoch": 0.1, "elapsed_s": 2.0}  # a line as training wrote it before grad_norm


def test_step_records_of_every_shape_read_and_a_torn_last_line_is_skipped(tmp_path):
    now = StepRecord.written(**{**STEP, "step": 4, "grad_norm": None, "progress": 0.5})
    path = tmp_path / StepRecord.FILE
    path.write_text(json.dumps(STEP) + "\n" + json.dumps(now.to_json()) + "\n" + '{"step": 5, "loss": 2.')
    old, new = StepRecord.lines(path)
    assert (old.version, old.progress, old.values()) == (1, None, STEP)
    assert new.version == StepRecord.VERSION == 2 and new.values() == {**STEP, "step": 4, "grad_norm": None,
                                                                         "progress": 0.5}
    assert StepRecord.lines(tmp_path / "absent.jsonl") == []


def test_a_step_record_without_what_its_version_always_writes_is_an_error():
    with pytest.raises(ValidationError, match="progress"):
        StepRecord.written(**STEP, grad_norm=1.0)  # today's writer always writes progress
    with pytest.raises(ValidationError):
        StepRecord.read({k: v for k, v in STEP.items() if k != "loss"})
