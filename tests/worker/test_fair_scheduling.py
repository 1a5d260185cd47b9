"""Issue 32, item 3: a busy worker reserves nothing it cannot start, so a newly queued job goes to an idle worker.

Found: two workers busy in long tasks had each reserved (received, unacknowledged) the message of a newly queued
job, which waited behind them while an idle third worker ran a job queued later. Prefetch 1 with acks_late does
not prevent it on Redis: after a broker reconnect the running task no longer counts against the new channel's
window. The test makes that happen (a broker restart while two workers are busy), then queues two jobs: one must
start on the idle worker within seconds, and the other must stay in the broker, held by no busy worker.

Three real `draftsmith worker` processes, the session's private redis-server (tests/worker/conftest.py). A worker
is kept busy by a job whose training would run for hours (the pattern of test_worker_faults.py); every job is
cancelled at the end."""

from __future__ import annotations

import time

import redis
from services import wait_until
from worker_harness import tiny_spec

ENDLESS = {"max_steps": 1_000_000, "max_minutes": 600, "checkpoint_every": 1_000_000}


def started(job: dict) -> bool:
    return job["status"] not in ("queued", "failed", "cancelled")


def consumers_waiting(client: redis.Redis) -> int:
    """Connections blocked in BRPOP: workers asking the broker for a message."""
    return sum(1 for c in client.client_list() if c.get("cmd") in ("brpop", "blpop"))


def test_a_new_job_starts_on_the_idle_worker_while_two_are_busy(workers, models):
    service = workers
    broker = redis.Redis(port=service.redis.port, socket_timeout=5)
    gpu_queue = f"{service.env['DRAFTSMITH_QUEUE_NAME']}.gpu"
    processes = [service.start_worker(name=f"fair-{name}") for name in ("a", "b", "c")]
    wait_until(lambda: all(" ready." in w.log() for w in processes), 180, "three workers ready", interval=0.5)
    jobs: list[str] = []
    try:
        busy = [service.submit(tiny_spec(f"file://{models}/bpe", training=ENDLESS)) for _ in range(2)]
        jobs += busy
        for job_id in busy:
            service.wait_for(job_id, started, 120, f"{job_id} to start")

        # The broker goes away and comes back while two workers are busy (a restart, a failover, a network blip).
        service.redis.restart(down_seconds=1)
        wait_until(lambda: consumers_waiting(broker) >= 1, 60, "the idle worker to reconnect", interval=0.2)
        time.sleep(3)  # time for the busy workers to reconnect too (and, before the fix, to ask for a message)

        fresh = [service.submit(tiny_spec(f"file://{models}/bpe", training=ENDLESS)) for _ in range(2)]
        jobs += fresh
        first = wait_until(lambda: next((j for j in fresh if started(service.job(j))), None), 30,
                           "a new job to start on the idle worker", interval=0.5)
        other = next(j for j in fresh if j != first)
        time.sleep(2)  # had a busy worker taken the other job's message, it would be gone from the queue by now
        assert service.job(other)["status"] == "queued"
        assert broker.llen(gpu_queue) == 1, "a busy worker reserved a job it cannot start"
        assert all(w.alive() for w in processes)
    finally:
        with service.http as http:
            for job_id in jobs:
                http.post(f"/v1/jobs/{job_id}/cancel")
        for job_id in jobs:
            service.wait_terminal(job_id, timeout=120)
