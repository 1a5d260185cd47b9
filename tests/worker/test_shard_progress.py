"""Issue 32: the lead of a fanned-out generate stage reports the job's progress summed over its shards, counting
finished shards whole, its own shard by the tokens generated against the planned ones, and another worker's by
what its heartbeat last wrote; never backwards. No service needed: the shard rows are given."""

from __future__ import annotations

from domain.shards import DONE, PENDING, RUNNING, ShardRow
from worker.shards import ShardClaims


class Reporter:
    def __init__(self):
        self.reports: list[tuple[float, str]] = []

    def progress(self, stage, fraction, detail):
        self.reports.append((fraction, detail))


def lead(max_new_tokens: int = 100) -> tuple[ShardClaims, Reporter]:
    claims = ShardClaims.__new__(ShardClaims)  # the summing alone: no database, no heartbeat
    reporter = Reporter()
    claims.reporter, claims.current, claims.max_new_tokens, claims._shown = reporter, None, max_new_tokens, 0.0
    return claims, reporter


def test_a_shard_finished_by_another_worker_counts_while_the_lead_is_mid_batch():
    claims, reporter = lead()
    claims.current = (0, 0, 150, 0.375)  # 8 prompts, one batch, 150 tokens in: 3/8 of its planned tokens
    rows = [ShardRow(0, RUNNING, 1, "lead", 8, 0, 0, None),  # the lead's own row lags (heartbeat)
            ShardRow(1, DONE, 1, "helper", 8, 8, 640, 4.0),
            ShardRow(2, PENDING, 0, None, 8, 0, 0, None),
            ShardRow(3, PENDING, 0, None, 8, 0, 0, None)]
    claims._report(rows)
    fraction, detail = reporter.reports[-1]
    assert fraction == (8 * 0.375 + 8) / 32  # not 0: the finished shard counts whole, the lead's by its tokens
    assert "0/32" not in detail and "8/32 prompts, 790 tokens; 1 of 4 shards whole, 2 workers" in detail


def test_another_workers_running_shard_counts_by_its_heartbeat_and_progress_never_goes_back():
    claims, reporter = lead(max_new_tokens=100)
    rows = [ShardRow(0, RUNNING, 1, "helper", 4, 0, 100, None),  # mid-batch: 100 of 400 planned tokens
            ShardRow(1, RUNNING, 1, "other", 4, 2, 50, None)]  # a batch of 2 done: half, more than its tokens say
    claims._report(rows)
    assert reporter.reports[-1][0] == (1 + 2) / 8
    # The helper died; its shard is claimed again from scratch: the job's progress holds.
    rows[0] = ShardRow(0, RUNNING, 2, "rescuer", 4, 0, 0, None)
    claims._report(rows)
    assert reporter.reports[-1][0] == (1 + 2) / 8
    rows = [ShardRow(0, DONE, 2, "rescuer", 4, 4, 300, 1.0), ShardRow(1, DONE, 1, "other", 4, 4, 320, 1.0)]
    claims._report(rows)
    assert reporter.reports[-1][0] == 1.0
