"""A job whose worker died and that waits for a free worker: the reaper re-queues it once and it shows
"waiting for a worker" (status `waiting`) until a worker takes it up, however long that takes; it is not
re-queued (with a warning event) every stale-after period meanwhile. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from domain import runs as stage_runner
from domain.models import Job, StageRun, utcnow
from domain.states import JobStatus, Stage

STALE_AFTER_SECONDS = 600


def _quiet_for_an_hour(harness, job_id: str) -> None:
    """The job's heartbeat and its last change an hour ago, as after a worker died (no clock to wait on)."""
    past = utcnow() - timedelta(hours=1)
    with harness.services.session_factory() as session:
        session.execute(update(StageRun).where(StageRun.job_id == job_id, StageRun.status == "running")
                        .values(heartbeat_at=past).execution_options(synchronize_session=False))
        session.execute(update(Job).where(Job.id == job_id).values(updated_at=past)
                        .execution_options(synchronize_session=False))
        session.commit()


def _reap(harness, job_id: str) -> list[tuple[str, Stage]]:
    """One reaper pass; what it re-queued of this test's job (other tests' leftovers may be reaped too)."""
    with harness.services.session_factory() as session:
        taken = stage_runner.take_over_stale_jobs(session, STALE_AFTER_SECONDS)
    return [(taken_id, stage) for taken_id, stage in taken if taken_id == job_id]


def _job_in_training_whose_worker_died(harness, org) -> str:
    job_id = harness.create_job(org)["id"]
    for _ in range(2):  # prepare, generate
        harness.runner.run_stage(job_id)
    assert harness.runner.run_stage(job_id, finish=False) is Stage.TRAIN  # and its worker dies mid-stage
    _quiet_for_an_hour(harness, job_id)
    return job_id


def test_a_job_whose_worker_died_waits_for_a_worker_and_is_requeued_once(harness):
    org = harness.new_org()
    job_id = _job_in_training_whose_worker_died(harness, org)

    assert _reap(harness, job_id) == [(job_id, Stage.TRAIN)]
    body = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
    assert (body["status"], body["status_text"], body["stage"]) == ("waiting", "waiting for a worker", "train")
    listed = harness.client.get("/v1/jobs", params={"status": "waiting"}, headers=org.headers).json()["data"]
    assert [job["id"] for job in listed] == [job_id]  # the list's filter knows the status

    for _ in range(3):  # the workers stay busy for many stale-after periods: still one re-queue
        _quiet_for_an_hour(harness, job_id)
        assert _reap(harness, job_id) == []
    events = harness.client.get(f"/v1/jobs/{job_id}/events?limit=1000", headers=org.headers).json()["data"]
    to_waiting = [e for e in events if e["type"] == "job.status_changed" and e["data"]["to"] == "waiting"]
    assert len(to_waiting) == 1 and "waiting for a worker" in to_waiting[0]["message"]

    # A free worker takes the re-queued message: training resumes, and the job runs to the end.
    assert harness.runner.run_stage(job_id, finish=False) is Stage.TRAIN
    assert harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()["status"] == "training"
    with harness.services.session_factory() as session:
        stage_runner.finish_stage(session, job_id, Stage.TRAIN)
    assert harness.runner.run_to_end(job_id) is JobStatus.SUCCEEDED
    stages = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()["stages"]
    assert [s["status"] for s in stages if s["stage"] == "train"] == ["abandoned", "succeeded"]


def test_a_waiting_job_is_cancelled_at_once_and_resume_says_it_is_waiting(harness):
    org = harness.new_org()
    job_id = _job_in_training_whose_worker_died(harness, org)
    assert _reap(harness, job_id) == [(job_id, Stage.TRAIN)]

    early = harness.client.post(f"/v1/jobs/{job_id}/resume", headers=org.headers)
    assert early.status_code == 409 and "is waiting" in early.json()["detail"]  # its message is in the queue

    cancelled = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"  # no worker runs it, so nothing to wait for


def test_a_job_whose_hand_over_was_lost_waits_for_a_worker_and_is_requeued_once(harness):
    """Its stage finished and no worker took the next one up (the message between queues was lost): the same
    `waiting`, re-queued once at the next stage."""
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    assert harness.runner.run_stage(job_id) is Stage.PREPARE  # finished; generate never starts
    _quiet_for_an_hour(harness, job_id)

    assert _reap(harness, job_id) == [(job_id, Stage.GENERATE)]
    body = harness.client.get(f"/v1/jobs/{job_id}", headers=org.headers).json()
    assert (body["status"], body["status_text"]) == ("waiting", "waiting for a worker")
    _quiet_for_an_hour(harness, job_id)
    assert _reap(harness, job_id) == []

    assert harness.runner.run_to_end(job_id) is JobStatus.SUCCEEDED  # a worker takes it up at generate
