"""A stand-in for the Celery worker: drives jobs through their stages using only the stage-runner API
(domain/runs.py), exactly the calls the real worker will make, with tiny fake outputs."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from domain import runs
from domain.states import JobStatus, Stage
from domain.storage import LocalStorage, S3Storage
from schemas.validation_report import REPORT_VERSION, ValidationReport

FAKE_REPORT = ValidationReport(
    version=REPORT_VERSION, passed=True, block_size=4, tau=2.5, recommended_block_size=4,
    lossless={"greedy": {"prompts": 2, "tokens": 32, "mismatches": 0, "first_divergence": None, "block_size": 4},
              "sampling": {"status": "passed", "p_value": 0.4, "alpha": 0.001, "passed": True, "block_size": 4}},
)
"""The validation report the fake validate stage stores: a valid report.json (schemas/validation_report.py)."""


class FakeStageRunner:
    def __init__(self, session_factory: sessionmaker[Session], storage: LocalStorage | S3Storage) -> None:
        self.session_factory = session_factory
        self.storage = storage
        self.worker_id = f"fake-worker-{os.getpid()}"
        self.artifact_bytes: dict[str, bytes] = {}

    def run_stage(self, job_id: str, *, train_steps: int = 5, finish: bool = True) -> Stage | None:
        """Claim the next stage, report progress and outputs, and (by default) finish it."""
        with self.session_factory() as session:
            stage = runs.next_stage(session, job_id)
            if stage is None:
                return None
            runs.claim_stage(session, job_id, stage, worker_id=self.worker_id)
            runs.record_event(session, job_id, f"{stage}: half way", progress=50.0)
            if stage is Stage.TRAIN:
                for step in range(train_steps):
                    runs.record_metrics(session, job_id, step, {"loss": 3.0 / (step + 1), "lr": 6e-4})
            if stage is Stage.VALIDATE:
                runs.record_metrics(session, job_id, train_steps, {"tau": 2.5})
                self._store(session, job_id, "validation_report.json",
                            json.dumps(FAKE_REPORT.to_json()).encode(), kind="report",
                            content_type="application/json")
            if stage is Stage.EXPORT:
                self._store(session, job_id, "drafter/model.safetensors", os.urandom(4096) + job_id.encode(),
                            kind="safetensors")
            if finish:
                runs.finish_stage(session, job_id, stage)
            return stage

    def _store(self, session: Session, job_id: str, name: str, data: bytes, *, kind: str,
               content_type: str = "application/octet-stream") -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "artifact"
            path.write_bytes(data)
            artifact = runs.store_artifact(session, self.storage, job_id, name, path, kind=kind,
                                           content_type=content_type)
        assert artifact.sha256 == hashlib.sha256(data).hexdigest()
        self.artifact_bytes[f"{job_id}/{name}"] = data

    def run_to_end(self, job_id: str, *, fail_at: Stage | None = None) -> JobStatus:
        """Run stages until the job finishes, fails at `fail_at`, or a cancellation is observed."""
        while True:
            with self.session_factory() as session:
                if runs.cancellation_requested(session, job_id):
                    runs.acknowledge_cancellation(session, job_id)
                    break
                stage = runs.next_stage(session, job_id)
                if stage is None:
                    break
                if stage == fail_at:
                    runs.claim_stage(session, job_id, stage, worker_id=self.worker_id)
                    runs.fail_job(session, job_id, code="fake_failure", message=f"injected failure in {stage}",
                                  stage=stage)
                    break
            self.run_stage(job_id)
        with self.session_factory() as session:
            from domain.models import Job

            job = session.get(Job, job_id)
            assert job is not None
            return JobStatus(job.status)
