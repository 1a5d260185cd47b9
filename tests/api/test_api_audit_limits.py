"""Issue 32, item 2: drift audits are under the organisation's active-work limit and can be cancelled.

Jobs and audits count together (queued, running and cancelling ones) against `max_concurrent_jobs`, refused with
429 `concurrency-limit` and Retry-After as for jobs; `POST /v1/audits/{id}/cancel` ends a queued audit at once,
marks a running one `cancelling` (the worker stops it: tests/worker/test_audit_cancel.py), is a no-op when repeated,
and answers 409 `invalid-transition` for a finished one. The concurrent burst against a real server on
PostgreSQL: tests/api/test_api_concurrency.py."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from domain.audits import audit_heartbeat, claim_audit, take_over_stale_audits
from domain.models import Audit, utcnow

AUDIT = {"drafter": "hf://acme/drafter", "target": {"uri": "bundled:smollm2-135m"}}


def create_audit(harness, org) -> dict:
    response = harness.client.post("/v1/audits", json=AUDIT, headers=org.headers)
    assert response.status_code == 201, response.text
    return response.json()


def set_status(harness, audit_id: str, status: str) -> None:
    with harness.services.session_factory() as session:
        session.execute(update(Audit).where(Audit.id == audit_id).values(status=status))
        session.commit()


def test_jobs_and_audits_share_the_active_work_limit(harness):
    org = harness.new_org(limit=2)
    harness.create_job(org)
    audit = create_audit(harness, org)
    for path, body in (("/v1/audits", AUDIT), ("/v1/jobs", {"target": {"uri": "bundled:smollm2-135m"}})):
        response = harness.client.post(path, json=body, headers=org.headers)
        assert response.status_code == 429, (path, response.text)
        problem = response.json()
        assert problem["type"].endswith("concurrency-limit") and int(response.headers["retry-after"]) > 0
        assert (problem["active_jobs"], problem["active_audits"], problem["limit"]) == (1, 1, 2)
        assert "1 active audits" in problem["detail"] and "/v1/audits/{id}/cancel" in problem["detail"]
    # A running audit still holds its slot; a finished or cancelled one frees it.
    set_status(harness, audit["id"], "running")
    assert harness.client.post("/v1/audits", json=AUDIT, headers=org.headers).status_code == 429
    set_status(harness, audit["id"], "failed")
    second = create_audit(harness, org)
    assert harness.client.post(f"/v1/audits/{second['id']}/cancel", headers=org.headers).status_code == 200
    create_audit(harness, org)


def test_cancelling_a_queued_audit_ends_it_at_once_and_the_worker_never_claims_it(harness):
    org = harness.new_org()
    audit = create_audit(harness, org)
    response = harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=org.headers)
    assert response.status_code == 200, response.text
    cancelled = response.json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    again = harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=org.headers)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"  # idempotent, as for jobs
    with harness.services.session_factory() as session:
        assert claim_audit(session, audit["id"], "worker-1") is None  # the message still in the broker: ignored
    listed = harness.client.get("/v1/audits", headers=org.headers).json()["data"]
    assert [(a["id"], a["status"]) for a in listed] == [(audit["id"], "cancelled")]


def test_a_running_audit_becomes_cancelling_and_its_heartbeat_says_stop(harness):
    org = harness.new_org()
    audit = create_audit(harness, org)
    with harness.services.session_factory() as session:
        assert claim_audit(session, audit["id"], "worker-1") is not None
        assert audit_heartbeat(session, audit["id"], "worker-1") is True
    response = harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=org.headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelling"
    assert response.json()["finished_at"] is None
    with harness.services.session_factory() as session:
        assert audit_heartbeat(session, audit["id"], "worker-1") is False  # the worker stops at its next beat
        # Its worker died before acknowledging: the reaper ends it cancelled rather than running it again.
        session.execute(update(Audit).where(Audit.id == audit["id"])
                        .values(heartbeat_at=utcnow() - timedelta(seconds=600)))
        session.commit()
        assert take_over_stale_audits(session, 60) == []
    got = harness.client.get(f"/v1/audits/{audit['id']}", headers=org.headers).json()
    assert got["status"] == "cancelled" and got["finished_at"] is not None


def test_cancelling_a_finished_audit_is_409_and_others_cannot_cancel(harness):
    org, stranger = harness.new_org(), harness.new_org()
    audit = create_audit(harness, org)
    assert harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=stranger.headers).status_code == 404
    read_only = harness.key_for(org, ("read",))
    assert harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=read_only).status_code == 403
    for status in ("succeeded", "failed"):
        set_status(harness, audit["id"], status)
        response = harness.client.post(f"/v1/audits/{audit['id']}/cancel", headers=org.headers)
        assert response.status_code == 409, response.text
        problem = response.json()
        assert problem["type"].endswith("invalid-transition") and problem["audit_status"] == status
        assert f"already {status}" in problem["detail"]
    assert harness.client.get(f"/v1/audits/{audit['id']}", headers=org.headers).json()["status"] == "failed"
