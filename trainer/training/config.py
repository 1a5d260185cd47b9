"""Typed training configuration. Defaults are the CPU recipe the main job runs (`schemas/recipe.py`, the one
source that a REST job, `draftsmith run` and the bench share); scale them on GPUs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from schemas import recipe
from schemas.job_spec import DRAFTER_ADAPTER_NEEDS_PARENT, MAX_DRAFTER_ADAPTER_RANK
from trainer.errors import DraftsmithError

WARM_START_PREFIX = "drafter:"
"""`init="drafter:/dir"` starts training from the weights of the drafter in /dir (a warm start):
one string, so it travels through RunConfig's JSON form and a launched job's spec file unchanged."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = recipe.TRAIN_STEPS
    """Optimizer steps (a time budget, below, may stop earlier)."""
    max_minutes: float | None = recipe.TRAIN_MAX_MINUTES
    """Stop (and checkpoint) once this much wall time has passed; all processes stop together."""
    batch_size: int = recipe.BATCH_SIZE
    """Sequences per micro-batch per process (many sequences, few anchors each, generalises better
    than few sequences with many anchors at the same cost)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    anchors_per_sequence: int = recipe.ANCHORS_PER_SEQUENCE
    """Blocks drafted per sequence in one forward pass."""
    lr: float = recipe.LEARNING_RATE
    """Peak learning rate of AdamW."""
    warmup_steps: int = recipe.WARMUP_STEPS
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss_decay_gamma: float | None = None
    """exp(-(k-1)/gamma) position weights; None picks the DFlash paper's value for the block size."""
    position_weighting: recipe.PositionWeighting = recipe.POSITION_WEIGHTING
    """`decay` (exp(-(k-1)/gamma), gamma below) or `dpace` (D-PACE: weights from the drafter's own confidence,
    detached; a DFlash 2 top-K miss counts as a miss, never as padding). trainer/training/position_weights.py."""
    dpace_alpha: float = recipe.DPACE_ALPHA
    """D-PACE's smoothing alpha in q~ = (1 - alpha) exp(-CE) + alpha."""
    acceptance_loss_weight: float = recipe.ACCEPTANCE_LOSS_WEIGHT
    """Weight of minus the expected accepted positions per block position (0: off), beside the cross-entropy."""
    selector_loss_weight: float = 1.0
    kl_weight: float = 0.0
    """Share of the target's own top-k distribution in each position's cross-entropy target (the rest is
    the regenerated token); needs data regenerated with a teacher signal, else ignored."""
    hidden_loss_weight: float = 0.0
    """Weight of the regression of the drafter's final hidden state onto the target's (teacher signal)."""
    draft_vocab_size: int | None = recipe.DRAFT_VOCAB_SIZE
    """The trained drafter drafts among this many most frequent regenerated tokens (trainer/drafter/draft_vocab.py;
    engines without a draft vocabulary use the full head); None or >= the vocabulary: the full vocabulary."""
    train_on_draft_vocab: bool = recipe.TRAIN_ON_DRAFT_VOCAB
    """With a draft vocabulary: the cross-entropy runs over its logits only (the EAGLE-3 recipe), which cuts the
    trainer's largest matmul by vocab / draft_vocab_size (trainer/training/objective.py)."""
    first_failure_only: bool = False
    """Spec-AUF: a block's positions after its first wrong prediction leave the cross-entropy (a verifier never
    reaches them)."""
    supervised_positions: int | None = None
    """Train block positions 1..K only (None: all B-1). Later positions are reached so rarely that their
    LM-head compute is better spent on more anchors."""
    bf16_matmuls: bool = recipe.BF16_MATMULS
    """On a float32 (CPU) target: the drafter's matmuls and the LM head in bfloat16 (weights, optimizer and
    losses stay float32); about 2x the steps per minute where the CPU has bfloat16 units."""
    context_noise: float = 0.0
    """Std of Gaussian noise added to the drafter's normed context features while training (regularises
    a drafter that memorises its context)."""
    init: Literal["target", "random"] | str = "random"
    """`target`: drafter layers start as copies of the target's last layers (trainer/training/init.py);
    `random`: N(0, 0.02). The context projection is whitened and convolutions start as the identity
    either way. `drafter:DIR`: a warm start from the drafter in DIR, whose shape must match (init.py)."""
    drafter_adapter_rank: int | None = None
    """A warm start only: train a LoRA of this rank over the parent's layers and `fc` instead of every weight, and
    write the PEFT adapter beside the merged drafter (trainer/training/drafter_adapter.py); None: every weight."""
    drafter_adapter_alpha: int | None = None
    """The adapter's LoRA alpha; None: rank x recipe.DRAFTER_ADAPTER_ALPHA_PER_RANK."""
    zero_stage: Literal[2, 3] = recipe.ZERO_STAGE
    """DeepSpeed ZeRO stage: 2 shards optimizer state and gradients, 3 also the drafter's weights."""
    checkpoint_every: int = recipe.CHECKPOINT_EVERY
    """Steps between resumable checkpoints (one is always written at the end)."""
    seed: int = recipe.SEED
    log_every: int = 10
    """Steps between progress lines (every step still goes to metrics.jsonl and the callbacks)."""

    def __post_init__(self) -> None:
        checks = {
            "steps": self.steps >= 1, "batch_size": self.batch_size >= 1, "grad_accum": self.grad_accum >= 1,
            "anchors_per_sequence": self.anchors_per_sequence >= 1, "lr": 0 < self.lr < 1,
            "warmup_steps": self.warmup_steps >= 0, "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
            "checkpoint_every": self.checkpoint_every >= 1, "zero_stage": self.zero_stage in (2, 3),
            "max_minutes": self.max_minutes is None or self.max_minutes > 0,
            "position_weighting": self.position_weighting in recipe.POSITION_WEIGHTINGS, "dpace_alpha": 0 < self.dpace_alpha < 1,
            "acceptance_loss_weight": self.acceptance_loss_weight >= 0,
            "init": self.init in ("target", "random") or (self.init.startswith(WARM_START_PREFIX)
                                                          and len(self.init) > len(WARM_START_PREFIX)),
            "drafter_adapter_rank": (self.drafter_adapter_rank is None
                                     or 1 <= self.drafter_adapter_rank <= MAX_DRAFTER_ADAPTER_RANK),
            "drafter_adapter_alpha": self.drafter_adapter_alpha is None or self.drafter_adapter_alpha >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise DraftsmithError(f"training setting {bad[0]}={getattr(self, bad[0])!r} is out of range")
        if self.drafter_adapter_rank is not None and self.parent_drafter is None:
            raise DraftsmithError(DRAFTER_ADAPTER_NEEDS_PARENT)

    @property
    def parent_drafter(self) -> str | None:
        """The drafter directory a warm start begins from (`init="drafter:DIR"`), else None."""
        return self.init.removeprefix(WARM_START_PREFIX) if self.init.startswith(WARM_START_PREFIX) else None

    @property
    def drafter_adapter(self) -> tuple[int, int] | None:
        """(rank, LoRA alpha) of the drafter adapter this run trains (alpha: the job's, else rank x the recipe's
        ratio); None: every weight trains."""
        rank = self.drafter_adapter_rank
        if rank is None:
            return None
        alpha = self.drafter_adapter_alpha
        return rank, alpha if alpha is not None else rank * recipe.DRAFTER_ADAPTER_ALPHA_PER_RANK

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

