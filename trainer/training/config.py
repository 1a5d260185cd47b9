"""Typed training configuration. Defaults are the CPU recipe the main job runs; scale them on GPUs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from trainer.errors import DraftsmithError


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    """Optimizer steps (a time budget, below, may stop earlier)."""
    max_minutes: float | None = None
    """Stop (and checkpoint) once this much wall time has passed; all processes stop together."""
    batch_size: int = 16
    """Sequences per micro-batch per process (many sequences, few anchors each, generalises better
    than few sequences with many anchors at the same cost)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    anchors_per_sequence: int = 12
    """Blocks drafted per sequence in one forward pass."""
    lr: float = 2e-3
    """Peak learning rate of AdamW."""
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss_decay_gamma: float | None = None
    """exp(-(k-1)/gamma) position weights; None picks the DFlash paper's value for the block size."""
    selector_loss_weight: float = 1.0
    init: Literal["target", "random"] = "random"
    """`target`: drafter layers start as copies of the target's last layers (trainer/training/init.py);
    `random`: N(0, 0.02). The context projection is whitened and convolutions start as the identity
    either way."""
    zero_stage: Literal[2, 3] = 2
    """DeepSpeed ZeRO stage: 2 shards optimizer state and gradients, 3 also the drafter's weights."""
    checkpoint_every: int = 200
    """Steps between resumable checkpoints (one is always written at the end)."""
    seed: int = 0
    log_every: int = 10
    """Steps between progress lines (every step still goes to metrics.jsonl and the callbacks)."""

    def __post_init__(self) -> None:
        checks = {
            "steps": self.steps >= 1, "batch_size": self.batch_size >= 1, "grad_accum": self.grad_accum >= 1,
            "anchors_per_sequence": self.anchors_per_sequence >= 1, "lr": 0 < self.lr < 1,
            "warmup_steps": self.warmup_steps >= 0, "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
            "checkpoint_every": self.checkpoint_every >= 1, "zero_stage": self.zero_stage in (2, 3),
            "max_minutes": self.max_minutes is None or self.max_minutes > 0,
            "init": self.init in ("target", "random"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise DraftsmithError(f"training setting {bad[0]}={getattr(self, bad[0])!r} is out of range")

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


MAIN_JOB_TRAINING = TrainConfig(steps=300, max_minutes=12.0)
"""The training of `draftsmith run`'s defaults: ~10 minutes on 2 CPU cores for SmolLM2-135M, the cosine
schedule run to its end (the time limit is a safety net, not the plan)."""
