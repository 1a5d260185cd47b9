"""report.json's model (schemas/validation_report.py): the JSON validation writes keeps its shape, older reports
(no `version`, fewer keys) load as version 1, an odd field is dropped rather than fatal, and the JSON Schema the
dashboard reads (report/static/validation_report.schema.json) is the model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.validation_report import REPORT_VERSION, ValidationReport, report_json_schema_text

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "dashboard" / "data" / "sample_job" / "report.json"
SCHEMA_FILE = ROOT / "report" / "static" / "validation_report.schema.json"


def test_the_committed_schema_is_the_models():
    assert SCHEMA_FILE.read_text() == report_json_schema_text(), (
        "report/static/validation_report.schema.json is stale: run `python -m schemas.validation_report`")


def test_an_older_report_without_version_loads_as_version_1_and_writes_back_unchanged():
    stored = json.loads(SAMPLE.read_text())
    assert "version" not in stored and "device" not in stored  # written before both existed
    report = ValidationReport.read(stored)
    assert report.version == 1 and report.tau == stored["tau"] and report.device is None
    assert report.sampling.verdict() == "passed" and report.greedy.mismatches == 0
    assert report.expected_tau_by_block_size[3] == stored["expected_tau_by_block_size"]["3"]  # int keys, typed
    assert report.to_json() == stored  # no key added, none lost, block sizes back to JSON's string keys


def test_a_written_report_keeps_validates_key_order_with_version_first():
    stored = json.loads(SAMPLE.read_text())
    fresh = ValidationReport(version=REPORT_VERSION, **{k: stored[k] for k in ("passed", "block_size", "tau")})
    assert list(fresh.to_json()) == ["version", "passed", "block_size", "tau"]


def test_unknown_keys_survive_and_odd_fields_are_dropped_not_fatal():
    report = ValidationReport.read({"tau": 1.4, "d2t": {"size": 32000}, "lossless": "unexpected shape",
                                    "speedup": 2.0})
    assert report.tau == 1.4 and report.lossless is None and report.speedup is None
    assert report.to_json() == {"tau": 1.4, "d2t": {"size": 32000}}
    assert ValidationReport.read(None).to_json() == {}
    with pytest.raises(ValidationError):
        ValidationReport.model_validate({"lossless": True})  # strict reading still refuses it


def test_engine_rows_keep_whether_they_were_refused():
    report = ValidationReport.read({"engines": {"rows": [{"engine": "vllm", "refused": "no GPU"},
                                                         {"engine": "llama.cpp", "tokens_per_s": 12}]}})
    refused, ran = report.engines.rows
    assert refused.did_not_run and not ran.did_not_run
    assert report.to_json()["engines"]["rows"][1] == {"engine": "llama.cpp", "tokens_per_s": 12}  # int stays int
