"""The publish stage says what a warm-started job's report says (report.json `warm_start.advice`, as the export's
drafter-record.json carries it): keep serving the parent unless the paired gain's interval lies above 1, as an event
before anything is published, and in the stage's summary. No database: the stage's records hold the job's artifacts
and keep the events they are given."""

from __future__ import annotations

import json
from types import SimpleNamespace

from drafters import EXPORTED_CONFIG

from schemas.job_spec import JobSpec
from schemas.lineage import DrafterRecord
from schemas.validation_report import ValidationReport
from trainer.export.record import drafter_record

KEEP = {"tau": 1.31, "warm_start": {
    "parent_tau": 1.3, "tau": 1.31, "advice": "keep_parent",
    "advice_reason": "keep serving the parent: the gain's 95 % interval does not lie above 1 (tau 1.310 vs the "
                     "parent's 1.300 at T=0, ratio 1.008 [0.97, 1.05] over 12 held-out prompts)",
    "gain_sampled": {"temperature": 0.0, "ratio": 1.0077, "ci95": [0.97, 1.05]}}}


class Records:
    session = None

    def __init__(self, artifacts: dict[str, bytes]):
        self.artifacts = artifacts
        self.events: list[tuple[str, str, dict | None]] = []

    def read_artifact(self, name: str) -> bytes | None:
        return self.artifacts.get(name)

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self.events.append((message, level, data))


def publish(tmp_path, report: dict | None) -> tuple[dict, Records]:
    """Publish a job whose export wrote the drafter's record from `report` (None: no record among its artifacts)."""
    import worker.publish

    artifacts = {} if report is None else {
        DrafterRecord.FILE: json.dumps(drafter_record(EXPORTED_CONFIG, ValidationReport.read(report)).to_json()).encode()}
    ctx = SimpleNamespace(job_dir=lambda job_id: tmp_path / job_id)
    records = Records(artifacts)
    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}})  # no destinations: nothing copied
    return worker.publish.publish_job(ctx, SimpleNamespace(id="job_1", org_id="org_1"), spec, records), records


def test_publish_says_to_keep_serving_the_parent_when_the_gain_is_not_shown(tmp_path):
    summary, records = publish(tmp_path, KEEP)
    assert summary == {"destinations": 0, "warm_start_advice": "keep_parent"}
    [(message, level, data)] = records.events
    assert message.startswith("publish: warm start: keep serving the parent: the gain's 95 % interval")
    assert level == "warning" and data["advice"] == "keep_parent" and data["ratio_ci95"] == [0.97, 1.05]


def test_publish_says_nothing_of_a_parent_for_a_job_without_one(tmp_path):
    summary, records = publish(tmp_path, {"tau": 1.4})
    assert summary == {"destinations": 0} and records.events == []
    summary, records = publish(tmp_path, None)  # no record among the artifacts
    assert summary == {"destinations": 0} and records.events == []
