"""A stage's progress events: mid-stage percentages are throttled to one a second, yet a stage that runs from its
start event to its end inside one second still shows one mid-stage event (the dashboard's bar moves for fast
stages too). No service needed: the event writes are captured."""

from __future__ import annotations

import pytest

from worker import reporting
from worker.reporting import StageReporter


@pytest.fixture
def reporter(monkeypatch):
    written: list[float] = []
    monkeypatch.setattr(reporting.runs, "record_event",
                        lambda session, job_id, message, stage, progress: written.append(progress))
    clock = [100.0]
    monkeypatch.setattr(reporting.time, "monotonic", lambda: clock[0])
    stage = StageReporter.__new__(StageReporter)  # the throttle alone: no database, no heartbeat
    stage.session, stage.job_id, stage.stage = None, "job", "train"
    stage._last_percent, stage._last_progress_at = -1.0, 0.0
    return stage, written, clock


def test_a_fast_stage_shows_its_first_mid_stage_event(reporter):
    stage, written, clock = reporter
    stage.progress("train", 0.0, "starting")
    clock[0] += 0.01
    stage.progress("train", 0.0, "loading the target")  # the same percent: not written again
    for step in range(1, 7):
        clock[0] += 0.05
        stage.progress("train", step / 6, f"step {step}")
    assert written == [0.0, 16.7, 100.0]


def test_mid_stage_events_are_at_most_one_a_second(reporter):
    stage, written, clock = reporter
    stage.progress("train", 0.0, "starting")
    for step in range(1, 41):
        clock[0] += 0.25
        stage.progress("train", step / 40, f"step {step}")
    assert written == [0.0, 2.5, 12.5, 22.5, 32.5, 42.5, 52.5, 62.5, 72.5, 82.5, 92.5, 100.0]
