"""D-PACE position weights and the expected-acceptance term: the fast grid code against plain references
(the paper's formula written as loops, the expectation enumerated over every accept/reject outcome), a
top-K miss counted as a miss, and a trainer run with each objective recorded in report.json and the card."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from test_training import drafter_config, tiny_batch

from schemas.validation_report import TrainingObjective
from trainer.errors import DraftsmithError
from trainer.training.config import TrainConfig
from trainer.training.loop import Trainer
from trainer.training.objective import DistillationObjective, FrozenTargetParts
from trainer.training.position_weights import (
    acceptance_loss,
    describe_objective,
    dpace_weights,
    expected_accepted,
)


def dpace_reference(confidence: list[float], valid: list[bool], alpha: float) -> list[float]:
    """w_j = sum_{m >= j} prod_{i <= m} q~_i over positions 1..B-1 of one block, the chain ending at the first
    invalid position; position 0 (the anchor) weighs 0."""
    last = next((k for k in range(1, len(valid)) if not valid[k]), len(valid))
    smoothed = [(1 - alpha) * c + alpha for c in confidence]
    weights = [0.0] * len(confidence)
    for j in range(1, last):
        weights[j] = sum(math.prod(smoothed[1:m + 1]) for m in range(j, last))
    return weights


def test_dpace_weights_follow_the_formula():
    torch.manual_seed(0)
    confidence = torch.rand(3, 4, 6)
    valid = torch.ones(3, 4, 6, dtype=torch.bool)
    valid[..., 0] = False  # anchors: never supervised
    valid[0, 1, 4:] = False  # the sequence ends inside a block
    valid[2, 3, 2:] = False
    for alpha in (0.3, 0.5, 0.7):
        got = dpace_weights(confidence, valid, alpha)
        for b, n in itertools.product(range(3), range(4)):
            expected = dpace_reference(confidence[b, n].tolist(), [True] + valid[b, n, 1:].tolist(), alpha)
            assert got[b, n].tolist() == pytest.approx(expected, rel=1e-5), (alpha, b, n)
    # Earlier positions gate later ones: weights never grow along a block.
    weights = dpace_weights(confidence, valid, 0.5)[..., 1:]
    assert bool((weights[..., :-1] >= weights[..., 1:]).all())


def test_a_miss_shrinks_every_later_weight_and_is_never_padding():
    """Confidence 0 (a top-K miss) leaves q~ = alpha in the chain: later positions weigh alpha times as much as
    after a sure position, where treating the miss as padding would have left them as they were."""
    valid = torch.ones(1, 1, 5, dtype=torch.bool)
    sure = torch.tensor([[[0.0, 1.0, 1.0, 1.0, 1.0]]])
    missed = torch.tensor([[[0.0, 1.0, 0.0, 1.0, 1.0]]])
    w_sure, w_missed = dpace_weights(sure, valid, 0.5), dpace_weights(missed, valid, 0.5)
    assert w_sure[0, 0].tolist() == [0.0, 4.0, 3.0, 2.0, 1.0]
    assert w_missed[0, 0, 3:].tolist() == pytest.approx((w_sure[0, 0, 3:] * 0.5).tolist())
    assert w_missed[0, 0, 1] < w_sure[0, 0, 1]


def test_dpace_weights_are_a_schedule_not_a_gradient_path():
    confidence = torch.rand(2, 3, 4, requires_grad=True)
    assert not dpace_weights(confidence, torch.ones(2, 3, 4, dtype=torch.bool), 0.5).requires_grad


def test_expected_acceptance_equals_the_enumerated_expectation():
    """E[accepted] = sum over every accept/reject outcome of its probability times its accepted prefix."""
    torch.manual_seed(1)
    p = torch.rand(2, 3, 5)
    valid = torch.ones(2, 3, 5, dtype=torch.bool)
    valid[1, 2, 3:] = False
    got = expected_accepted(p, valid)
    for b, n in itertools.product(range(2), range(3)):
        probs = [float(p[b, n, k]) if valid[b, n, k] else 0.0 for k in range(1, 5)]
        expected = 0.0
        for outcome in itertools.product((True, False), repeat=4):
            chance = math.prod(q if ok else 1 - q for q, ok in zip(probs, outcome, strict=True))
            prefix = next((i for i, ok in enumerate(outcome) if not ok), 4)
            expected += chance * prefix
        assert float(got[b, n]) == pytest.approx(expected, rel=1e-5)


def test_the_acceptance_loss_pushes_every_position_up_and_reports_tau():
    p = torch.full((1, 2, 4), 0.5, requires_grad=True)
    valid = torch.ones(1, 2, 4, dtype=torch.bool)
    loss, tau = acceptance_loss(p, valid)
    loss.backward()
    loss = loss.detach()
    assert float(tau) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert bool((p.grad[..., 1:] < 0).all()) and bool((p.grad[..., 0] == 0).all())  # descent raises p
    assert -1 <= float(loss) <= 0


def objective(target, variant: str = "dflash2", **settings) -> DistillationObjective:
    from trainer.drafter.model import Drafter

    torch.manual_seed(0)
    frozen = FrozenTargetParts(target.embedding_weight, target.lm_head.weight)
    return DistillationObjective(Drafter(drafter_config(target, variant)), frozen, **settings)


def test_dpace_objective_trains_both_terms_and_leaves_decay_unchanged(learnable_target, learnable_data):
    batch = tiny_batch(learnable_target, learnable_data)
    decay = objective(learnable_target)(batch)
    explicit = objective(learnable_target, weighting="decay", acceptance_loss_weight=0.0)(batch)
    torch.testing.assert_close(explicit["loss"], decay["loss"])
    dpace = objective(learnable_target, weighting="dpace", dpace_alpha=0.5)(batch)
    assert not torch.allclose(dpace["ce"], decay["ce"])  # other weights, same predictions
    assert torch.equal(dpace["correct"], decay["correct"])
    grads = {}
    # DFlash: a random DFlash 2 selector's top-K rarely holds the gold token, and a miss accepts nothing, so
    # the term would have no gradient to show.
    for weight in (0.0, 1.0):
        model = objective(learnable_target, "dflash", weighting="dpace", acceptance_loss_weight=weight)
        out = model(batch)
        out["loss"].backward()
        grads[weight] = torch.cat([p.grad.flatten() for p in model.drafter.parameters() if p.grad is not None])
        assert torch.isfinite(grads[weight]).all()
    assert 1.0 <= float(out["expected_tau"]) <= batch.block_size
    assert not torch.allclose(grads[1.0], grads[0.0])  # the acceptance term reaches the drafter's weights


def test_out_of_range_objective_settings_are_refused_by_name():
    with pytest.raises(DraftsmithError, match="position_weighting"):
        TrainConfig(position_weighting="linear")
    with pytest.raises(DraftsmithError, match="dpace_alpha"):
        TrainConfig(dpace_alpha=1.5)


@pytest.mark.parametrize("settings", [{"position_weighting": "dpace"},
                                      {"position_weighting": "dpace", "acceptance_loss_weight": 0.5}])
def test_training_runs_with_each_objective_and_records_it(learnable_target, learnable_data, tmp_path, settings):
    cfg = TrainConfig(steps=4, batch_size=2, anchors_per_sequence=4, lr=3e-3, warmup_steps=1, max_minutes=None,
                      checkpoint_every=10**6, **settings)
    records = []
    drafter_dir = Trainer(learnable_target, learnable_data, tmp_path, drafter_config(learnable_target), cfg, [records.append]).run()
    assert (drafter_dir / "model.safetensors").is_file()
    assert len(records) == 4 and all(math.isfinite(r["loss"]) for r in records)
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
    described = TrainingObjective.model_validate(describe_objective(cfg, 4))
    assert described.position_weighting == "dpace" and described.dpace_alpha == 0.5
    assert "D-PACE" in described.summary
    assert ("expected acceptance" in described.summary) == bool(settings.get("acceptance_loss_weight"))
    assert "gamma" in describe_objective(TrainConfig(), 8)["summary"]
