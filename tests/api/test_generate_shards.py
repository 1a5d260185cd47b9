"""Shard claims (domain/shards.py) on SQLite and PostgreSQL: each shard is held by one worker at a time, a quiet
holder's shard is taken over, a written shard stays done, and a resumed stage keeps the rows it had."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import update

from domain import shards
from domain.models import GenerateShard, utcnow


def _job(harness) -> str:
    return harness.create_job(harness.new_org())["id"]


def test_each_shard_is_claimed_once_and_a_quiet_holder_is_taken_over(harness):
    job_id = _job(harness)
    factory = harness.services.session_factory
    with factory() as session:
        assert shards.plan_shards(session, job_id, [4, 4, 2]) == 3
        assert shards.plan_shards(session, job_id, [4, 4, 2]) == 3  # a resumed stage: the rows are kept
        first = shards.claim_shard(session, job_id, "w1", stale_after_seconds=60)
        second = shards.claim_shard(session, job_id, "w2", stale_after_seconds=60)
        assert (first.shard, first.attempt, first.taken_from) == (0, 1, None)
        assert second.shard == 1
        assert shards.shard_heartbeat(session, job_id, 0, "w1", prompts_done=2, tokens=17)
        assert not shards.shard_heartbeat(session, job_id, 0, "w2", prompts_done=0, tokens=0)  # not w2's
        assert shards.finish_shard(session, job_id, 0, "w1", prompts=4, tokens=30, seconds=1.5)
        assert not shards.finish_shard(session, job_id, 0, "w3", prompts=4, tokens=30, seconds=9.0)  # done already

        # w2 goes quiet: its shard comes back to the next claimer, before the untouched shard 2.
        session.execute(update(GenerateShard).where(GenerateShard.job_id == job_id, GenerateShard.shard == 1)
                        .values(heartbeat_at=utcnow() - timedelta(seconds=120)))
        session.commit()
        taken = shards.claim_shard(session, job_id, "w3", stale_after_seconds=60)
        assert (taken.shard, taken.attempt, taken.taken_from) == (1, 2, "w2")
        assert not shards.shard_heartbeat(session, job_id, 1, "w2", prompts_done=3, tokens=9)  # w2 lost it
        assert shards.claim_shard(session, job_id, "w1", stale_after_seconds=60).shard == 2
        assert shards.claim_shard(session, job_id, "w1", stale_after_seconds=60) is None  # all held

        shards.release_shard(session, job_id, 2, "w1")  # w1 stops on request: free at once
        assert shards.claim_shard(session, job_id, "w4", stale_after_seconds=60).shard == 2
        rows = shards.shard_rows(session, job_id)
    assert [(r.shard, r.status, r.worker_id) for r in rows] == [(0, "done", "w1"), (1, "running", "w3"),
                                                                (2, "running", "w4")]
    assert (rows[0].prompts_done, rows[0].tokens, rows[0].seconds) == (4, 30, 1.5)


def test_racing_workers_never_share_a_shard(harness):
    job_id = _job(harness)
    factory = harness.services.session_factory
    with factory() as session:
        shards.plan_shards(session, job_id, [1] * 12)
    won: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with factory() as session:
                while (claim := shards.claim_shard(session, job_id, name, stale_after_seconds=60)) is not None:
                    won.setdefault(name, []).append(claim.shard)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    claimed = sorted(shard for got in won.values() for shard in got)
    assert claimed == list(range(12))  # every shard once, none twice
