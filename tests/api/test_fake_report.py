"""The fake stage runner's validate stage stores a report.json the dashboard and the worker can read: it validates
against schemas/validation_report.py strictly (no field dropped), as the real validate stage's does."""

from __future__ import annotations

import json

from fake_stage_runner import FAKE_REPORT

from schemas.validation_report import REPORT_VERSION, ValidationReport


def test_the_fake_validate_stage_stores_a_valid_report():
    stored = json.loads(json.dumps(FAKE_REPORT.to_json()))  # the bytes FakeStageRunner stores, read back
    report = ValidationReport.model_validate(stored)  # strict: a misshapen field raises here
    assert report.version == REPORT_VERSION and report.passed is True and report.tau == 2.5
    assert report.greedy.mismatches == 0 and report.sampling.verdict() == "passed"
    assert report.to_json() == stored
