"""Drives jobs through their stages for the browser tests, the way the worker does: only through the
stage-runner API (domain/runs.py).

The outputs are tests/dashboard/data/sample_job/ (report.json, metrics.jsonl and model_card.md, an
export's README.md): the main job's published figures in exactly the keys `validate` writes (see
make_sample.py there for what is measured and what is illustrative); report.html is written from them
by the trainer's real writer.

What the page relies on, as the worker does it: per-step training metrics flattened by the trainer's
own `step_metrics` (`loss`, `accuracy_pos_K` for draft position K...), the validation report as
artifact `report.json` (kind `report`), the model card as `README.md` (kind `model-card`).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from domain import runs
from domain.storage import LocalStorage, S3Storage
from trainer.pipeline import step_metrics  # how the worker flattens a training record into metric points

SAMPLE_JOB = Path(__file__).parent / "data" / "sample_job"


def sample_report() -> dict:
    return json.loads((SAMPLE_JOB / "report.json").read_text())


def sample_records() -> list[dict]:
    return [json.loads(line) for line in (SAMPLE_JOB / "metrics.jsonl").read_text().splitlines() if line.strip()]


def variant_report(report: dict, *, scale: float, variant_note: str) -> dict:
    """A second, different report for comparisons: acceptances scaled by `scale` (a made-up drafter)."""
    other = copy.deepcopy(report)
    other["tau_per_position"] = [None if a is None else round(min(1.0, a * scale), 4) for a in report["tau_per_position"]]
    reached = None  # a cycle reaches draft k when drafts 1..k-1 were accepted
    for item in other.get("acceptance_by_position", []):
        item["reached"] = item["reached"] if reached is None else reached
        item["accepted"] = reached = min(item["reached"], round(item["accepted"] * scale))
        item["conditional"] = round(item["accepted"] / item["reached"], 4) if item["reached"] else None
        item["unconditional"] = round(item["accepted"] / item["offered"], 4) if item["offered"] else None
    other["tau"] = round(1 + (report["tau"] - 1) * scale, 4)
    for entry in other.get("acceptance_by_category", {}).values():
        entry["tau"] = round(1 + (entry["tau"] - 1) * scale, 4)
    other["note"] = variant_note
    return other


def inconclusive_report(report: dict) -> dict:
    """The same job's report had its sampling test tested nothing: sampling_inconclusive.json is the real
    test's output with too few draws (make_sample.py), and a greedy job still passes on the exact match."""
    other = copy.deepcopy(report)
    other["lossless"]["sampling"] = json.loads((SAMPLE_JOB / "sampling_inconclusive.json").read_text())
    return other


class JobDriver:
    def __init__(self, session_factory: sessionmaker[Session], storage: LocalStorage | S3Storage) -> None:
        self.session_factory = session_factory
        self.storage = storage
        self.worker_id = f"dashboard-test-worker-{os.getpid()}"
        self.stored: dict[str, bytes] = {}  # "job/name" -> bytes, to check downloads against

    def claim(self, job_id: str, stage: str) -> None:
        with self.session_factory() as session:
            runs.claim_stage(session, job_id, stage, worker_id=self.worker_id)

    def event(self, job_id: str, message: str, *, progress: float | None = None, level: str = "info") -> None:
        with self.session_factory() as session:
            runs.record_event(session, job_id, message, progress=progress, level=level)

    def finish(self, job_id: str, stage: str) -> None:
        with self.session_factory() as session:
            runs.finish_stage(session, job_id, stage)

    def store(self, job_id: str, name: str, data: bytes, *, kind: str, content_type: str) -> None:
        with tempfile.TemporaryDirectory() as tmp, self.session_factory() as session:
            path = Path(tmp) / "artifact"
            path.write_bytes(data)
            runs.store_artifact(session, self.storage, job_id, name, path, kind=kind, content_type=content_type)
        self.stored[f"{job_id}/{name}"] = data

    def backdate(self, job_id: str, stage: str, seconds: float) -> None:
        """Start the latest attempt of `stage` `seconds` earlier: how the ETA tests get a stage that has run
        for minutes without waiting for them."""
        from datetime import timedelta

        from domain.models import StageRun

        with self.session_factory() as session:
            run = (session.query(StageRun).filter_by(job_id=job_id, stage=stage)
                   .order_by(StageRun.attempt.desc()).first())
            run.started_at -= timedelta(seconds=seconds)
            session.commit()

    def worker_went_quiet(self, job_id: str) -> None:
        """The worker of the job's running stage died ten days ago, and a reaper pass re-queues the job: it is
        `waiting` for a worker. The window is days long so no other test's job is reaped with it."""
        from datetime import timedelta

        from sqlalchemy import update

        from domain.models import Job, StageRun, utcnow

        past = utcnow() - timedelta(days=10)
        with self.session_factory() as session:
            session.execute(update(StageRun).where(StageRun.job_id == job_id, StageRun.status == "running")
                            .values(heartbeat_at=past).execution_options(synchronize_session=False))
            session.execute(update(Job).where(Job.id == job_id).values(updated_at=past)
                            .execution_options(synchronize_session=False))
            session.commit()
            taken = runs.take_over_stale_jobs(session, timedelta(days=5).total_seconds())
        assert job_id in [taken_id for taken_id, _stage in taken], taken

    def quick_stage(self, job_id: str, stage: str) -> None:
        self.claim(job_id, stage)
        self.event(job_id, f"{stage}: working", progress=50.0)
        self.finish(job_id, stage)

    def train(self, job_id: str, records: list[dict], *, finish: bool = True) -> None:
        self.claim(job_id, "train")
        last = records[-1]["step"] if records else 0
        with self.session_factory() as session:
            for record in records:
                runs.record_metrics(session, job_id, record["step"], step_metrics(record))
                if record["step"] % 50 == 0 or record is records[-1]:
                    runs.record_event(session, job_id, f"step {record['step']} loss {record['loss']:.3f}",
                                      progress=100.0 * record["step"] / max(last, 1))
        if finish:
            self.finish(job_id, "train")

    def validate(self, job_id: str, report: dict) -> None:
        self.claim(job_id, "validate")
        self.event(job_id, "validating on held-out prompts", progress=10.0)
        if report["lossless"]["sampling"]["p_value"] < 0.01:
            self.event(job_id, "sampling test p-value is low", level="warning")
        self.store(job_id, "report.json", json.dumps(report, indent=2).encode(), kind="report",
                   content_type="application/json")
        with self.session_factory() as session:
            runs.record_metrics(session, job_id, 0, {"tau": report["tau"], "speedup": report["speedup"]["ratio"]})
        self.finish(job_id, "validate")

    def export(self, job_id: str, report: dict, records: list[dict]) -> None:
        from trainer.export.artifacts import write_report_html

        self.claim(job_id, "export")
        with tempfile.TemporaryDirectory() as tmp:
            metrics = Path(tmp) / "metrics.jsonl"
            metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
            html = write_report_html(tmp, report, metrics).read_bytes()
        self.store(job_id, "report.html", html, kind="report-html", content_type="text/html")
        self.store(job_id, "README.md", (SAMPLE_JOB / "model_card.md").read_bytes(), kind="model-card",
                   content_type="text/markdown")
        self.store(job_id, "drafter/model.safetensors", os.urandom(64 * 1024) + job_id.encode(), kind="safetensors",
                   content_type="application/octet-stream")
        self.finish(job_id, "export")

    def run_to_success(self, job_id: str, report: dict | None = None, records: list[dict] | None = None) -> None:
        report = report or sample_report()
        records = records if records is not None else sample_records()
        self.quick_stage(job_id, "prepare")
        self.quick_stage(job_id, "generate")
        self.train(job_id, records)
        self.validate(job_id, report)
        self.export(job_id, report, records)
        self.quick_stage(job_id, "publish")

    def fail(self, job_id: str, stage: str, message: str) -> None:
        self.claim(job_id, stage)
        with self.session_factory() as session:
            runs.fail_job(session, job_id, code="worker_lost", message=message, stage=stage)
