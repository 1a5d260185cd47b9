"""The learning-rate schedule planned for a time budget: a run cut by its budget still ends its decay."""

from __future__ import annotations

import pytest

from trainer.training.config import TrainConfig
from trainer.training.schedule import BudgetSchedule


def test_without_a_budget_the_schedule_is_a_function_of_the_step():
    cfg = TrainConfig(steps=100, warmup_steps=10, max_minutes=None, lr=1e-3, min_lr_ratio=0.1)
    schedule = BudgetSchedule(cfg)
    factors = [schedule.factor(step) for step in range(100)]
    assert factors[:10] == sorted(factors[:10]) and factors[9] < 1.0  # warm-up rises
    assert factors[10] == pytest.approx(1.0)
    assert factors[10:] == sorted(factors[10:], reverse=True)  # then decays
    assert schedule.factor(100) == pytest.approx(0.1)
    assert not schedule.after_step(99, 1e6) and schedule.after_step(100, 1e6)  # time does not end it


def test_a_slow_machine_ends_its_decay_at_the_budget():
    """Steps planned for a fast machine, a budget of 60 s, and 2 s per step: the run ends after ~30 steps with
    the learning rate at its floor, not half-way down a cosine planned for 1,000 steps."""
    cfg = TrainConfig(steps=1000, warmup_steps=5, max_minutes=1.0, lr=1e-3, min_lr_ratio=0.1)
    schedule = BudgetSchedule(cfg)
    step, factors = 0, []
    while True:
        factors.append(schedule.factor(step))
        step += 1
        if schedule.after_step(step, 2.0 * step):
            break
    assert step == 30
    assert factors[6:] == sorted(factors[6:], reverse=True)
    assert factors[-1] < 0.12 and schedule.factor(step) == pytest.approx(0.1)
    assert schedule.progress(step) == 1.0


def test_the_time_spent_survives_a_resume():
    cfg = TrainConfig(steps=1000, warmup_steps=0, max_minutes=1.0)
    first = BudgetSchedule(cfg)
    first.after_step(10, 30.0)
    resumed = BudgetSchedule(cfg)
    resumed.load_state(first.state())
    assert resumed.progress(10) == pytest.approx(0.5) and resumed.factor(10) == first.factor(10)
