"""The learning-rate schedule, planned for the steps *and* the time a run has.

Warm-up, then a cosine from the peak to `min_lr_ratio` over the run's progress, where progress is the larger
of the steps done over the steps planned and, with a time budget (`TrainConfig.max_minutes`), the training
time spent over the budget. A run ends when its progress reaches 1, so it always finishes its decay: a slow
machine trains fewer steps, each at the learning rate a complete schedule gives it, instead of being cut
off at a high learning rate half-way through a cosine planned for steps it never reaches. Without a budget
the schedule is a pure function of the step (and so exactly reproducible).

Every rank uses the slowest rank's clock (`distributed.maximum`), so all stop at the same step; the time
spent is carried in the checkpoint, so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import math

from trainer.training.config import TrainConfig


class BudgetSchedule:
    def __init__(self, cfg: TrainConfig, spent_s: float = 0.0):
        self.cfg = cfg
        self.budget_s = None if cfg.max_minutes is None else cfg.max_minutes * 60.0
        self.spent_s = spent_s
        """Training seconds spent so far (this run's and, after a resume, the earlier runs')."""
        self.warmup_spent_s: float | None = 0.0 if cfg.warmup_steps == 0 else None
        """Seconds the warm-up took: the cosine's share of the budget starts after it."""

    def time_progress(self) -> float:
        if self.budget_s is None:
            return 0.0
        warmup = self.warmup_spent_s or 0.0
        return (self.spent_s - warmup) / max(1e-9, self.budget_s - warmup)

    def progress(self, step: int) -> float:
        """Share of the decay done before optimizer step `step` (0-based), in [0, 1]."""
        cfg = self.cfg
        by_steps = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return min(1.0, max(0.0, by_steps, self.time_progress()))

    def factor(self, step: int) -> float:
        """The learning-rate multiplier of optimizer step `step` (torch's LambdaLR calls this)."""
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * self.progress(step)))

    def after_step(self, steps_done: int, spent_s: float) -> bool:
        """Record the time spent after `steps_done` steps; True when the run is complete."""
        self.spent_s = spent_s
        if self.warmup_spent_s is None and steps_done >= self.cfg.warmup_steps:
            self.warmup_spent_s = spent_s
        return steps_done >= self.cfg.steps or (self.budget_s is not None and spent_s >= self.budget_s)

    def state(self) -> dict:
        return {"spent_s": self.spent_s, "warmup_spent_s": self.warmup_spent_s}

    def load_state(self, state: dict) -> None:
        self.spent_s = float(state.get("spent_s", 0.0))
        self.warmup_spent_s = state.get("warmup_spent_s", self.warmup_spent_s)
