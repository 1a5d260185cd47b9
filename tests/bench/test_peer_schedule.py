"""bench/peers/peer_run.py's OUR_SCHEDULE, the schedule the peers' `ours` rows are given, is read from the product's
own training defaults (TrainConfig's, which take schemas/recipe.py's), so a change there reaches the peers' rows."""

from __future__ import annotations

import dataclasses

from bench.peers import peer_run
from bench.peers.peer_run import OUR_SCHEDULE, our_schedule
from schemas import recipe
from trainer.training import config as training_config
from trainer.training.blocks import default_decay_gamma
from trainer.training.config import TrainConfig


def test_our_schedule_is_the_trainers_defaults():
    defaults = TrainConfig()
    assert OUR_SCHEDULE == {
        "learning_rate": defaults.lr, "warmup_steps": defaults.warmup_steps, "lr_scheduler": "cosine",
        "min_lr_ratio": defaults.min_lr_ratio, "adam_betas": recipe.ADAM_BETAS, "weight_decay": defaults.weight_decay,
        "max_grad_norm": defaults.grad_clip, "loss_decay_gamma": default_decay_gamma(recipe.BLOCK_SIZE)}
    assert OUR_SCHEDULE["learning_rate"] == recipe.LEARNING_RATE and OUR_SCHEDULE["warmup_steps"] == recipe.WARMUP_STEPS


def test_a_change_to_the_defaults_changes_it(monkeypatch):
    changed = dataclasses.replace(TrainConfig(), lr=5e-4, warmup_steps=7, min_lr_ratio=0.2, weight_decay=0.0,
                                  grad_clip=0.5, loss_decay_gamma=6.0)
    monkeypatch.setattr(training_config, "TrainConfig", lambda: changed)
    monkeypatch.setattr(peer_run.recipe, "ADAM_BETAS", (0.8, 0.99))
    schedule = our_schedule()
    assert (schedule["learning_rate"], schedule["warmup_steps"], schedule["min_lr_ratio"], schedule["weight_decay"],
            schedule["max_grad_norm"], schedule["loss_decay_gamma"], schedule["adam_betas"]) == (
        5e-4, 7, 0.2, 0.0, 0.5, 6.0, (0.8, 0.99))


def test_the_trainer_builds_its_optimizer_with_the_recipes_betas():
    import torch

    from trainer.training.loop import make_optimizer

    drafter = torch.nn.Linear(4, 4)  # what make_optimizer reads of a drafter: its parameters and modules
    optimizer = make_optimizer(drafter, TrainConfig())
    assert isinstance(optimizer, torch.optim.AdamW)
    assert all(tuple(group["betas"]) == recipe.ADAM_BETAS for group in optimizer.param_groups)
