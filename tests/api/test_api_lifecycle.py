"""The whole job lifecycle through HTTP, with the fake stage runner in the worker's place.
Runs on SQLite and PostgreSQL (the `harness` fixture is parametrised over both)."""

from __future__ import annotations

import hashlib

import pytest

from domain import runs as stage_runner
from domain.errors import InvalidTransition
from domain.queue import RecordingQueue
from domain.states import STAGE_ORDER, TRANSITIONS, JobStatus, Stage


def test_job_runs_every_stage_to_success(harness):
    org = harness.new_org()
    job = harness.create_job(org, {"target": {"uri": "bundled:smollm2-135m"}, "labels": {"team": "search"}})
    assert job["status"] == "queued" and job["stages"] == [] and job["labels"] == {"team": "search"}
    assert isinstance(harness.services.queue, RecordingQueue)
    assert harness.services.queue.job_ids()[-1] == job["id"]  # enqueued by task name for the worker

    seen_statuses = []
    for expected in STAGE_ORDER:
        stage = harness.runner.run_stage(job["id"], finish=False)
        assert stage == expected
        body = harness.client.get(f"/v1/jobs/{job['id']}", headers=org.headers).json()
        seen_statuses.append(body["status"])
        assert body["stage"] == str(expected) and body["stage_progress"] == 50.0
        with harness.services.session_factory() as session:
            stage_runner.finish_stage(session, job["id"], stage)
    assert seen_statuses == ["preparing", "generating", "training", "validating", "exporting", "publishing"]

    final = harness.client.get(f"/v1/jobs/{job['id']}", headers=org.headers).json()
    assert final["status"] == "succeeded" and final["finished_at"] is not None and final["error"] is None
    assert [(s["stage"], s["status"], s["attempt"]) for s in final["stages"]] == [
        (str(stage), "succeeded", 1) for stage in STAGE_ORDER
    ]

    events = harness.client.get(f"/v1/jobs/{job['id']}/events?limit=1000", headers=org.headers).json()
    ids = [e["id"] for e in events["data"]]
    assert ids == list(range(1, len(ids) + 1))  # gapless, in order
    transitions = [(e["data"]["from"], e["data"]["to"]) for e in events["data"] if e["type"] == "job.status_changed"]
    assert transitions[0] == ("queued", "preparing") and transitions[-1] == ("publishing", "succeeded")
    assert events["job_status"] == "succeeded"

    artifacts = harness.client.get(f"/v1/jobs/{job['id']}/artifacts", headers=org.headers).json()["data"]
    assert {a["name"] for a in artifacts} == {"drafter/model.safetensors", "validation_report.json"}
    model = next(a for a in artifacts if a["kind"] == "safetensors")
    download = harness.client.get(model["download_path"], headers=org.headers)
    assert download.status_code == 200
    assert download.content == harness.runner.artifact_bytes[f"{job['id']}/drafter/model.safetensors"]
    assert hashlib.sha256(download.content).hexdigest() == model["sha256"]
    assert download.headers["etag"] == f'"{model["sha256"]}"'
    missing = harness.client.get(f"/v1/jobs/{job['id']}/artifacts/nope.bin", headers=org.headers)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


def test_failed_job_resumes_at_the_failed_stage(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    assert harness.runner.run_to_end(job_id, fail_at=Stage.TRAIN) is JobStatus.FAILED

    failed = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "fake_failure", "message": "injected failure in train", "stage": "train"}
    assert [s["status"] for s in failed["stages"]] == ["succeeded", "succeeded", "failed"]

    resumed = harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "queued" and resumed.json()["error"] is None
    assert resumed.json()["resume_count"] == 1
    assert harness.services.queue.job_ids().count(job_id) == 2  # enqueued again

    assert harness.runner.run_stage(job_id) is Stage.TRAIN  # prepare/generate are not rerun
    assert harness.runner.run_to_end(job_id) is JobStatus.SUCCEEDED
    stages = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()["stages"]
    assert [(s["stage"], s["attempt"], s["status"]) for s in stages if s["stage"] == "train"] == [
        ("train", 1, "failed"), ("train", 2, "succeeded"),
    ]
    # A succeeded job is terminal: neither resume nor cancel applies.
    for action in ("resume", "cancel"):
        response = harness.client.post(f"/v1/jobs/{job_id}/{action}", headers=org.headers)
        assert response.status_code == 409 and "succeeded" in response.json()["detail"]


def test_cancel_running_job_waits_for_the_worker_then_resume_continues(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    harness.runner.run_stage(job_id)  # prepare done
    harness.runner.run_stage(job_id, finish=False)  # generate running

    cancelling = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert cancelling.status_code == 200 and cancelling.json()["status"] == "cancelling"
    assert cancelling.json()["cancel_requested"] is True
    again = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert again.status_code == 200 and again.json()["status"] == "cancelling"  # idempotent

    with harness.services.session_factory() as session:
        assert stage_runner.cancellation_requested(session, job_id)
        with pytest.raises(stage_runner.CancellationPending):
            stage_runner.claim_stage(session, job_id, Stage.GENERATE)
        stage_runner.acknowledge_cancellation(session, job_id)
    cancelled = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
    assert cancelled["status"] == "cancelled"
    assert [(s["stage"], s["status"]) for s in cancelled["stages"]] == [("prepare", "succeeded"),
                                                                          ("generate", "cancelled")]

    assert harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers).status_code == 200
    assert harness.runner.run_stage(job_id) is Stage.GENERATE
    assert harness.runner.run_to_end(job_id) is JobStatus.SUCCEEDED


def test_cancel_queued_job_is_immediate_and_the_worker_cannot_start_it(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    response = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    with harness.services.session_factory() as session, pytest.raises(InvalidTransition):
        stage_runner.claim_stage(session, job_id, Stage.PREPARE)


def test_stage_runner_guards_order_and_redelivery(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    with harness.services.session_factory() as session:
        with pytest.raises(stage_runner.StageConflict):
            stage_runner.claim_stage(session, job_id, Stage.TRAIN)  # not the next stage
        first = stage_runner.claim_stage(session, job_id, Stage.PREPARE, worker_id="w1")
        # The task is redelivered to another worker: the first attempt is abandoned, not duplicated.
        second = stage_runner.claim_stage(session, job_id, Stage.PREPARE, worker_id="w2")
        assert (first.attempt, second.attempt) == (1, 2)
        with pytest.raises(stage_runner.StageConflict):
            stage_runner.finish_stage(session, job_id, Stage.GENERATE)  # nothing running there
        stage_runner.finish_stage(session, job_id, Stage.PREPARE)
        with pytest.raises(ValueError, match="percentage"):
            stage_runner.record_event(session, job_id, "bad", progress=140.0)
        assert stage_runner.record_metrics(session, job_id, 0, {"loss": float("nan")}) == 1
    body = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
    assert [(s["attempt"], s["status"], s["worker_id"]) for s in body["stages"]] == [
        (1, "abandoned", "w1"), (2, "succeeded", "w2"),
    ]
    metrics = harness.client.get(f"/v1/jobs/{job_id}/metrics", headers=org.headers).json()
    assert metrics["series"][0]["points"] == [{"step": 0, "value": None}]  # NaN stored as null


def test_transition_table_is_closed_and_terminal_states_are_final():
    assert set(TRANSITIONS) == set(JobStatus)
    assert TRANSITIONS[JobStatus.SUCCEEDED] == frozenset()
    assert TRANSITIONS[JobStatus.FAILED] == TRANSITIONS[JobStatus.CANCELLED] == frozenset({JobStatus.QUEUED})
    assert JobStatus.SUCCEEDED in TRANSITIONS[JobStatus.PUBLISHING]
    assert JobStatus.SUCCEEDED not in TRANSITIONS[JobStatus.TRAINING]  # no skipping to the end


def test_metrics_downsampling_and_step_range(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    from domain.models import MetricPoint

    with harness.services.session_factory() as session:  # bulk insert: 1000 record_metrics commits are slow
        session.add_all(MetricPoint(job_id=job_id, name="loss", step=s, value=float(s)) for s in range(1000))
        session.commit()
    full = harness.client.get(f"/v1/jobs/{job_id}/metrics?name=loss&max_points=1000", headers=org.headers).json()
    assert full["series"][0]["total_points"] == 1000 and not full["series"][0]["downsampled"]
    small = harness.client.get(f"/v1/jobs/{job_id}/metrics?name=loss&max_points=10", headers=org.headers).json()
    series = small["series"][0]
    assert series["downsampled"] and len(series["points"]) == 10
    assert series["points"][0] == {"step": 99, "value": 49.5}  # mean of steps 0..99
    assert series["points"][-1] == {"step": 999, "value": 949.5}
    ranged = harness.client.get(f"/v1/jobs/{job_id}/metrics?step_min=10&step_max=19", headers=org.headers).json()
    assert [p["step"] for p in ranged["series"][0]["points"]] == list(range(10, 20))
    bad = harness.client.get(f"/v1/jobs/{job_id}/metrics?step_min=5&step_max=1", headers=org.headers)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "step_max"


def test_a_racing_update_is_refused_with_409_not_lost(harness, monkeypatch):
    """The API read a job, the worker changed it, the API's write must not overwrite the worker's."""
    import api.routes.jobs as job_routes
    from domain.models import Job

    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    real_cancel = job_routes.cancel_job

    def cancel_after_the_worker_moved(session, org_id, cancelled_id):  # noqa: ANN001
        stale = session.get(Job, cancelled_id)  # the API has read the job (queued)...
        with harness.services.session_factory() as worker_session:  # ...the worker starts it meanwhile...
            stage_runner.claim_stage(worker_session, cancelled_id, Stage.PREPARE)
        assert stale.status == "queued"
        return real_cancel(session, org_id, cancelled_id)  # ...and the API writes from its stale copy

    monkeypatch.setattr(job_routes, "cancel_job", cancel_after_the_worker_moved)
    response = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert response.status_code == 409 and response.json()["type"].endswith("concurrent-update"), response.json()
    assert harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()["status"] == "preparing"
    monkeypatch.setattr(job_routes, "cancel_job", real_cancel)
    retried = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert retried.status_code == 200 and retried.json()["status"] == "cancelling"
