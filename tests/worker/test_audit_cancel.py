"""Issue 32, item 2, in the worker: `POST /v1/audits/{id}/cancel` stops a running audit within seconds (the heartbeat
sees `cancelling`, the measurement's next progress call raises), and a cancelled queued audit is never started.

`execute_audit` (worker/audits.py) runs in this process on PostgreSQL, as the Celery task would; the measurement
(`trainer.audit.run_audit`) is replaced by one that reports progress until it is stopped, so the test measures
the worker's plumbing, not a model. The API's side: tests/api/test_api_audit_limits.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database
from sqlalchemy import func, select

from domain.models import Audit, UsageRecord
from domain.queue import all_queues


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Iterator[Harness]:
    from migrations.revisions import upgrade

    root = tmp_path_factory.mktemp("audit-cancel")
    drafter = root / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text('{"block_size": 4}')
    (drafter / "model.safetensors").write_bytes(b"\0" * 64)
    url, drop = fresh_postgres_database("draftsmith_audit_cancel")
    upgrade(url)
    try:
        settings = make_settings(url, root / "storage", allowed_file_roots=[str(root)],
                                 worker_cache_dir=str(root / "cache"), worker_heartbeat_seconds=0.2,
                                 worker_stale_after_seconds=30)
        yield from build_harness(settings)
    finally:
        drop()


@pytest.fixture
def measuring(monkeypatch) -> dict:
    """Stands in for trainer.audit.run_audit: progress every 50 ms for up to a minute, unless stopped."""
    seen: dict = {"started": threading.Event(), "calls": 0}

    def measure(spec, *, target, drafter, prompts, on_progress=None, device="unset", **_):
        seen["device"] = device
        seen["started"].set()
        for done in range(1200):
            seen["calls"] += 1
            if on_progress:
                on_progress(done, 1200, f"prompt {done}")
            time.sleep(0.05)
        raise AssertionError("the measurement was not stopped")

    monkeypatch.setattr("trainer.audit.run_audit", measure)
    return seen


def submit(harness: Harness, org) -> str:
    body = {"drafter": f"file://{harness.settings.allowed_file_roots[0]}/drafter",
            "target": {"uri": "bundled:smollm2-135m"}}
    response = harness.client.post("/v1/audits", json=body, headers=org.headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_cancelling_a_running_audit_stops_its_worker_within_seconds(harness, measuring):
    from worker.audits import execute_audit
    from worker.context import WorkerContext

    ctx = WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))
    org = harness.new_org()
    audit_id = submit(harness, org)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("outcome", execute_audit(ctx, audit_id)), daemon=True)
    worker.start()
    assert measuring["started"].wait(60), "the audit never started measuring"
    time.sleep(0.5)  # a few progress steps: it is really running
    assert harness.client.get(f"/v1/audits/{audit_id}", headers=org.headers).json()["status"] == "running"

    asked = time.monotonic()
    response = harness.client.post(f"/v1/audits/{audit_id}/cancel", headers=org.headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelling", response.text
    worker.join(timeout=10)
    assert not worker.is_alive(), "the worker did not stop the audit"
    assert time.monotonic() - asked < 5
    assert result["outcome"] == "cancelled"
    assert measuring["device"] == harness.settings.worker_device  # the worker's DRAFTSMITH_WORKER_DEVICE reached it
    audit = harness.client.get(f"/v1/audits/{audit_id}", headers=org.headers).json()
    assert audit["status"] == "cancelled" and audit["finished_at"] is not None and audit["result"] is None
    with harness.services.session_factory() as session:  # the compute it did spend still counts
        assert session.scalar(select(func.count()).select_from(UsageRecord)
                              .where(UsageRecord.audit_id == audit_id)) == 1


def test_a_cancelled_queued_audit_is_never_started(harness, measuring):
    from worker.audits import execute_audit
    from worker.context import WorkerContext

    ctx = WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))
    org = harness.new_org()
    audit_id = submit(harness, org)
    assert harness.client.post(f"/v1/audits/{audit_id}/cancel", headers=org.headers).json()["status"] == "cancelled"
    assert execute_audit(ctx, audit_id) == "nothing_to_do"  # its message was still in the broker
    assert not measuring["started"].is_set()
    with harness.services.session_factory() as session:
        row = session.get(Audit, audit_id)
        assert (row.status, row.attempts, row.started_at) == ("cancelled", 0, None)
