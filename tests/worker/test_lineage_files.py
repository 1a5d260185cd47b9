"""`record_lineage` (worker/drafters.py) records the drafter's shape, metrics and serving flags as the export's
drafter-record.json says (trainer/export/record.py), and reads the job's work files through their models
(schemas/work_files.py): a stage marker, prepare.json or sources.json with a field of the wrong type, or written
before the files had a `version`, still yields the drafter's lineage, with that one field left empty. A job
exported before the record existed is recorded from its drafter/config.json and report.json by the export's own
rule, to the same record. No database: object storage is a dict and the publish stage's records are a stand-in
that keeps what it is given."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from drafters import EXPORTED_CONFIG

from schemas.job_spec import JobSpec
from schemas.lineage import DrafterLineage, DrafterMetrics, DrafterRecord, DrafterShape
from schemas.validation_report import ValidationReport
from schemas.work_files import PinnedSources, StageMarker
from trainer.export.record import drafter_record

WORK = "jobs/job_1/work"
REPORT = {"version": 1, "tau": 1.6, "tau_per_position": [0.9, 0.7], "recommended_block_size": 4,
          "lossless": {"greedy": {"mismatches": 0}, "sampling": {"p_value": 0.5, "status": "passed"}},
          "target_fingerprint": "sha256:report"}
DRAFTER_CONFIG = EXPORTED_CONFIG.to_hf_dict()  # drafter/config.json as the export writes it


class Storage:
    def __init__(self, files: dict[str, object]):
        self.files = {key: json.dumps(value).encode() for key, value in files.items()}

    def exists(self, key: str) -> bool:
        return key in self.files

    def open_chunks(self, key: str):
        yield self.files[key]

    def list_keys(self, prefix: str) -> dict[str, int]:
        return {key: len(value) for key, value in self.files.items() if key.startswith(prefix)}


class Records:
    """The publish stage's records: the job's registered artifacts (name -> storage key) read from `storage`."""

    session = None

    def __init__(self, storage: Storage, artifacts: dict[str, str]):
        self.storage, self.artifacts = storage, artifacts

    def read_artifact(self, name: str) -> bytes | None:
        return self.storage.files[self.artifacts[name]] if name in self.artifacts else None

    def record_drafter(self, **recorded) -> str:
        self.recorded = recorded
        return "drf_recorded"


def record(work: dict[str, object], spec: dict | None = None, drafter: dict | None = None) -> dict:
    """What record_lineage hands the drafters table. `drafter`: the export's drafter-record.json; None: a job
    exported before the record existed (its drafter/config.json and report.json only)."""
    import worker.drafters

    artifacts = {"manifest.json": "artifacts/manifest.json", "drafter/config.json": "artifacts/config.json"}
    if drafter is not None:
        artifacts[DrafterRecord.FILE] = f"artifacts/{DrafterRecord.FILE}"
    files = {f"{WORK}/{name}": content for name, content in work.items()}
    files |= {"artifacts/manifest.json": {"files": []}, "artifacts/config.json": DRAFTER_CONFIG,
              f"artifacts/{DrafterRecord.FILE}": drafter, f"{WORK}/data/shard-0.parquet": "rows"}
    storage = Storage(files)
    ctx, records = SimpleNamespace(storage=storage, job_dir=lambda job_id: Path("/nonexistent") / job_id), \
        Records(storage, artifacts)
    job_spec = JobSpec.model_validate(spec or {"target": {"uri": "bundled:smollm2-135m"}})
    assert worker.drafters.record_lineage(ctx, SimpleNamespace(id="job_1"), job_spec, records) == "drf_recorded"
    return records.recorded


GOOD = {
    "sources.json": {"target": {"uri": "bundled:smollm2-135m", "revision": "r1", "pinned_uri": "bundled:smollm2-135m"},
                     "prompts": {"uri": "builtin", "revision": "p1", "pinned_uri": "builtin"}},
    "prepare.json": {"fingerprint": "sha256:prepared", "mask_token_id": 5, "tap_layer_ids": [1, 2],
                     "train_prompts": 90, "holdout_prompts": 10},
    "report.json": REPORT,
    "stages/generate.json": {"examples": 90, "response_tokens": 4000, "plan": {"shards": 1}},
    "stages/train.json": {"steps": 40, "final_loss": 2.5, "train_tau_estimate": 1.4,
                          "environment": {"draftsmith": "0.1.0", "packages": {"torch": "2.5"}}},
}


def test_lineage_of_well_formed_unversioned_files():
    recorded = record(GOOD)
    lineage, metrics = recorded["lineage"], recorded["metrics"]
    assert isinstance(lineage, DrafterLineage) and isinstance(metrics, DrafterMetrics)
    assert isinstance(recorded["config"], DrafterShape) and recorded["config"].target_layer_ids == [1, 2]
    assert (recorded["target_revision"], recorded["target_fingerprint"]) == ("r1", "sha256:prepared")
    stored = lineage.to_json()
    assert stored["version"] == DrafterLineage.VERSION
    assert stored["target"] == {"uri": "bundled:smollm2-135m", "revision": "r1", "pinned_uri": "bundled:smollm2-135m"}
    assert stored["data"]["source_revision"] == "p1" and stored["data"]["examples"] == 90
    assert stored["data"]["train_prompts"] == 90 and stored["data"]["snapshot"]["files"] == 1
    assert stored["training"] == {"steps": 40, "final_loss": 2.5, "train_tau_estimate": 1.4}
    assert stored["code"] == {"draftsmith": "0.1.0", "packages": {"torch": "2.5"}} and stored["parent"] is None
    assert metrics.tau == 1.6 and metrics.lossless_passed is False  # no greedy-and-sampling verdict recorded
    assert metrics.serving is not None and metrics.serving.vllm == {"method": "dflash", "num_speculative_tokens": 3}


def test_a_warm_starts_lineage_names_the_parents_format_gain_and_advice():
    """A specialised drafter's record says what its parent was (format and method, recognised by content), what
    it gained over it at the job's parameters with the interval, and which of the two to serve: what the report
    measured, carried as written, so the drafter list answers "did training pay?" without opening report.json."""
    gain = {"temperature": 0.7, "parent_tau": 1.3, "tau": 1.5, "ratio": 1.154, "ci95": [1.05, 1.26], "prompts": 12}
    warm_start = {"parent_tau": 1.3, "tau": 1.5, "gain_sampled": gain, "advice": "serve_new",
                  "parent": {"name": "hf://z-lab/parent", "format": "z-lab", "variant": "dflash",
                             "upgrades": ["DFlash to DFlash 2"]}}
    work = {**GOOD, "report.json": {**REPORT, "warm_start": warm_start},
            "sources.json": {**GOOD["sources.json"], "init": {"uri": "hf://z-lab/parent", "revision": "abc"}}}
    spec = {"target": {"uri": "bundled:smollm2-135m"}, "init": {"from_drafter": "hf://z-lab/parent"}}
    recorded = record(work, spec)
    parent = recorded["lineage"].to_json()["parent"]
    assert (parent["ref"], parent["revision"], parent["tau_on_this_target"]) == ("hf://z-lab/parent", "abc", 1.3)
    assert parent["origin"]["format"] == "z-lab" and parent["origin"]["upgrades"] == ["DFlash to DFlash 2"]
    assert parent["gain"]["ci95"] == [1.05, 1.26] and parent["advice"] == "serve_new"
    assert recorded["metrics"].parent_tau == 1.3
    assert "adapter" not in parent  # every weight was trained


def test_a_drafter_adapter_jobs_lineage_carries_the_adapters_size():
    adapter = {"rank": 16, "alpha": 32, "trainable_parameters": 400_000, "drafter_parameters": 40_000_000,
               "trainable_share": 0.01, "bytes": 1_600_000, "folder": "drafter-adapter"}
    work = {**GOOD, "report.json": {**REPORT, "warm_start": {"parent_tau": 1.3, "tau": 1.5, "adapter": adapter}}}
    spec = {"target": {"uri": "bundled:smollm2-135m"}, "init": {"from_drafter": "hf://z-lab/parent"},
            "training": {"drafter_adapter": {"rank": 16}}}
    parent = record(work, spec)["lineage"].to_json()["parent"]
    assert parent["adapter"] == adapter


def test_a_stage_file_with_a_bad_field_still_yields_lineage():
    """The planted violation: fields of the wrong type in the train marker, prepare.json and sources.json. Read by
    key they would reach the drafter row as they are (or fail the publish stage); read through the models, each
    is dropped and everything else is recorded."""
    bad = {**GOOD,
           "stages/train.json": {**GOOD["stages/train.json"], "steps": "many", "environment": "somewhere"},
           "stages/generate.json": {"examples": [90], "response_tokens": 4000},
           "prepare.json": {**GOOD["prepare.json"], "train_prompts": {"n": 90}},
           "sources.json": {**GOOD["sources.json"], "target": "bundled:smollm2-135m@r1"}}
    stored = record(bad)["lineage"].to_json()
    assert stored["training"] == {"steps": None, "final_loss": 2.5, "train_tau_estimate": 1.4}
    assert stored["code"] == {}  # an unreadable environment: none recorded, as for a job that had no marker
    assert stored["data"]["examples"] is None and stored["data"]["response_tokens"] == 4000
    assert stored["data"]["train_prompts"] is None and stored["data"]["holdout_prompts"] == 10
    assert stored["target"] == {"uri": "bundled:smollm2-135m", "revision": None, "pinned_uri": None}
    assert DrafterLineage.read(stored) == DrafterLineage.read(json.loads(json.dumps(stored)))


def test_missing_work_files_leave_their_part_empty():
    recorded = record({"report.json": REPORT})
    stored = recorded["lineage"].to_json()
    assert recorded["target_fingerprint"] == "sha256:report" and recorded["target_revision"] is None
    assert stored["training"] == {"steps": None, "final_loss": None, "train_tau_estimate": None}


def test_the_worker_writes_markers_and_sources_through_the_models():
    """What worker/stages.py and worker/job_files.py write reads back as the same model, version included."""
    marker = StageMarker.written(**GOOD["stages/train.json"], device={"device": "cpu"})
    assert StageMarker.read(json.loads(json.dumps(marker.to_json()))).summary() == {
        **GOOD["stages/train.json"], "device": {"device": "cpu"}}
    sources = PinnedSources.written(**GOOD["sources.json"])
    assert PinnedSources.read(sources.to_json()).target == sources.target


def test_the_record_the_export_writes_is_what_the_worker_records():
    """A new job: shape, metrics and serving flags are drafter-record.json's, field for field, and the worker reads
    neither report.json nor drafter/config.json for them (both absent from storage here but the record's source).
    The same job exported before the record existed (no drafter-record.json) is recorded identically."""
    warm_start = {"parent_tau": 1.3, "tau": 1.5, "advice": "serve_new", "parent": {"name": "hf://z-lab/parent"}}
    report = {**REPORT, "warm_start": warm_start}
    written = drafter_record(EXPORTED_CONFIG, ValidationReport.read(report)).to_json()
    spec = {"target": {"uri": "bundled:smollm2-135m"}, "init": {"from_drafter": "hf://z-lab/parent"}}
    work = {name: content for name, content in GOOD.items() if name != "report.json"}
    new = record(work, spec, drafter=json.loads(json.dumps(written)))
    assert new["config"].to_json() == written["shape"] and new["metrics"].to_json() == written["metrics"]
    assert written["metrics"]["serving"] == {
        "sglang": "--speculative-algorithm DFLASH --speculative-num-draft-tokens 4",
        "vllm": {"method": "dflash", "num_speculative_tokens": 3},
        "llama_cpp": "--spec-type draft-dflash --spec-draft-n-max 3"}
    assert written["shape"] == {"version": 1, "hidden_size": 64, "vocab_size": 512, "num_target_layers": 4,
                                "target_layer_ids": [1, 2], "mask_token_id": 5, "architecture": "DFlashDraftModel"}
    assert new["lineage"].to_json()["parent"]["tau_on_this_target"] == 1.3
    old = record({**work, "report.json": report}, spec)
    for key in ("config", "metrics", "lineage"):
        assert new[key].to_json() == old[key].to_json(), key
    assert {k: v for k, v in new.items() if k not in ("config", "metrics", "lineage")} == {
        k: v for k, v in old.items() if k not in ("config", "metrics", "lineage")}


def test_a_record_missing_what_the_export_always_writes_fails_the_publish():
    from trainer.errors import DraftsmithError

    written = drafter_record(EXPORTED_CONFIG, ValidationReport.read(REPORT)).to_json()
    with pytest.raises(DraftsmithError, match="drafter-record.json does not fit"):
        record(GOOD, drafter={**written, "shape": {**written["shape"], "hidden_size": None}})
