"""The publish stage says what a warm-started job's report says (report.json `warm_start.advice`): keep serving the
parent unless the paired gain's interval lies above 1, as an event before anything is published, and in the stage's
summary. No database: object storage is a dict and the stage's records keep the events they are given."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from schemas.job_spec import JobSpec

KEEP = {"tau": 1.31, "warm_start": {
    "parent_tau": 1.3, "tau": 1.31, "advice": "keep_parent",
    "advice_reason": "keep serving the parent: the gain's 95 % interval does not lie above 1 (tau 1.310 vs the "
                     "parent's 1.300 at T=0, ratio 1.008 [0.97, 1.05] over 12 held-out prompts)",
    "gain_sampled": {"temperature": 0.0, "ratio": 1.0077, "ci95": [0.97, 1.05]}}}


class Storage:
    def __init__(self, files: dict[str, object]):
        self.files = {key: json.dumps(value).encode() for key, value in files.items()}

    def get_file(self, key: str, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(self.files[key])


class Records:
    session = None

    def __init__(self):
        self.events: list[tuple[str, str, dict | None]] = []

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self.events.append((message, level, data))


def publish(monkeypatch, tmp_path, report: dict | None) -> tuple[dict, Records]:
    import worker.publish

    keys = {} if report is None else {"report.json": "artifacts/report.json"}
    monkeypatch.setattr(worker.publish, "artifact_named", lambda session, job_id, name: (
        SimpleNamespace(storage_key=keys[name]) if name in keys else None))
    ctx = SimpleNamespace(storage=Storage({} if report is None else {"artifacts/report.json": report}),
                          job_dir=lambda job_id: tmp_path / job_id)
    records = Records()
    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}})  # no destinations: nothing copied
    return worker.publish.publish_job(ctx, SimpleNamespace(id="job_1", org_id="org_1"), spec, records), records


def test_publish_says_to_keep_serving_the_parent_when_the_gain_is_not_shown(monkeypatch, tmp_path):
    summary, records = publish(monkeypatch, tmp_path, KEEP)
    assert summary == {"destinations": 0, "warm_start_advice": "keep_parent"}
    [(message, level, data)] = records.events
    assert message.startswith("publish: warm start: keep serving the parent: the gain's 95 % interval")
    assert level == "warning" and data["advice"] == "keep_parent" and data["ratio_ci95"] == [0.97, 1.05]


def test_publish_says_nothing_of_a_parent_for_a_job_without_one(monkeypatch, tmp_path):
    summary, records = publish(monkeypatch, tmp_path, {"tau": 1.4})
    assert summary == {"destinations": 0} and records.events == []
    summary, records = publish(monkeypatch, tmp_path, None)  # no report among the artifacts
    assert summary == {"destinations": 0} and records.events == []
