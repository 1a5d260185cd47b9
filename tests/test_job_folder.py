"""The table of a job's files (schemas/job_folder.py): the local pipeline, the worker's stage inputs and markers
and the export put each file where the table says, and an exported folder's files read by the table's models."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.job_folder import (
    DATA_META,
    DRAFTER_CONFIG,
    EXPORTED_DRAFTER_CONFIG,
    EXPORTED_REPORT,
    EXPORTED_STEP_RECORDS,
    JOB_FILES,
    PREPARED,
    REPORT,
    SOURCES,
    STAGE_MARKER,
    STEP_RECORDS,
)
from schemas.stages import Stage
from schemas.validation_report import ValidationReport
from schemas.work_files import StepRecord

SAMPLE_EXPORT = Path(__file__).parent / "dashboard" / "data" / "sample_job"


def test_the_pipeline_reads_and_writes_the_work_folder_where_the_table_says(tmp_path):
    from trainer.pipeline import Layout

    work, out = tmp_path / "work", tmp_path / "out"
    layout = Layout.under(work, out)
    assert (layout.prepared, layout.report, layout.metrics) == (work / PREPARED.path, work / REPORT.path,
                                                                work / STEP_RECORDS.path)
    assert layout.data == (work / DATA_META.path).parent and layout.drafter == (work / DRAFTER_CONFIG.path).parent
    assert layout.metrics.relative_to(work).as_posix() == "train/metrics.jsonl"  # stored jobs keep their keys


def test_the_worker_mirrors_the_files_each_stage_reads_by_the_tables_paths():
    from worker.stages import STAGE_INPUTS

    assert {SOURCES.path, PREPARED.path, STEP_RECORDS.path, REPORT.path} <= set(STAGE_INPUTS[Stage.EXPORT])
    assert STAGE_MARKER.name(stage=Stage.TRAIN) == "stages/train.json"


def test_an_exported_folder_reads_by_the_tables_models():
    report = EXPORTED_REPORT.model.load(SAMPLE_EXPORT / EXPORTED_REPORT.path)
    assert isinstance(report, ValidationReport) and report.tau is not None
    steps = StepRecord.lines(SAMPLE_EXPORT / EXPORTED_STEP_RECORDS.path)
    assert len(steps) > 10 and [s.step for s in steps] == sorted(s.step for s in steps)


def test_every_file_has_one_place():
    places = [(file.folder, file.path) for file in JOB_FILES]
    assert len(places) == len(set(places)) and all(not path.startswith("/") for _, path in places)


def test_the_drafters_config_reads_whole_by_the_tables_model():
    from drafters import EXPORTED_CONFIG

    written = EXPORTED_CONFIG.to_hf_dict()  # drafter/config.json as the export writes it
    config = EXPORTED_DRAFTER_CONFIG.model.read(written)
    assert config.to_json() == json.loads(json.dumps(written))  # nothing dropped, nothing added: engines read it
    assert config.dflash_config is not None and config.dflash_config["mask_token_id"] == EXPORTED_CONFIG.mask_token_id
    ours = EXPORTED_DRAFTER_CONFIG.model.read({**written, "draftsmith": {"target_fingerprint": "sha256:ff",
                                                                         "recommended_block_size": 3}})
    assert ours.draftsmith is not None and (ours.draftsmith.target_fingerprint, ours.draftsmith.recommended_block_size) \
        == ("sha256:ff", 3)
