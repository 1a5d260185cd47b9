"""The fused, chunked cross-entropy through a frozen head against the plain computation."""

from __future__ import annotations

import pytest
import torch

from kernels.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_reference


@pytest.mark.parametrize(("chunk", "soft_weight"), [(7, 0.0), (64, 0.0), (1000, 0.0), (7, 0.6), (64, 1.0)])
def test_matches_the_plain_computation(chunk, soft_weight):
    torch.manual_seed(0)
    rows, hidden_size, vocab = 50, 24, 301
    head = torch.randn(vocab, hidden_size)
    labels = torch.randint(0, vocab, (rows,))
    weights = torch.rand(rows)
    weights /= weights.sum()
    start = torch.randn(rows, hidden_size)
    # A teacher's top-4 distribution per row (ids may repeat the gold label, as a real teacher's do).
    soft = {}
    if soft_weight:
        soft_ids = torch.randint(0, vocab, (rows, 4))
        soft_ids[:, 0] = labels
        soft = {"soft_ids": soft_ids, "soft_probs": torch.softmax(torch.randn(rows, 4), -1), "soft_weight": soft_weight}
    results = []
    for function in (linear_cross_entropy_reference, linear_cross_entropy):
        hidden = start.clone().requires_grad_(True)
        kwargs = {"chunk": chunk} if function is linear_cross_entropy else {}
        loss, predicted, top = function(hidden, head, labels, weights, top_k=5, **kwargs, **soft)
        (2.5 * loss).backward()  # an upstream gradient other than 1 must flow through
        results.append((loss.detach(), predicted, top, hidden.grad))
    (loss_a, pred_a, top_a, grad_a), (loss_b, pred_b, top_b, grad_b) = results
    torch.testing.assert_close(loss_b, loss_a)
    torch.testing.assert_close(grad_b, grad_a)
    assert torch.equal(pred_a, pred_b)
    assert torch.equal(top_a.sort(-1).values, top_b.sort(-1).values)


def test_refuses_a_trainable_head():
    head = torch.randn(10, 4, requires_grad=True)
    with pytest.raises(ValueError, match="frozen head"):
        linear_cross_entropy(torch.randn(3, 4), head, torch.tensor([1, 2, 3]), torch.ones(3) / 3)


def test_soft_targets_change_the_gradient_towards_the_teacher():
    """With the teacher's whole mass on the gold token the mixture is plain cross-entropy; elsewhere it differs."""
    torch.manual_seed(1)
    head, hidden = torch.randn(50, 8), torch.randn(6, 8)
    labels, weights = torch.randint(0, 50, (6,)), torch.full((6,), 1 / 6)
    plain = linear_cross_entropy(hidden, head, labels, weights)[0]
    on_gold = linear_cross_entropy(hidden, head, labels, weights, soft_ids=labels[:, None],
                                   soft_probs=torch.ones(6, 1), soft_weight=0.5)[0]
    elsewhere = linear_cross_entropy(hidden, head, labels, weights, soft_ids=(labels[:, None] + 1) % 50,
                                     soft_probs=torch.ones(6, 1), soft_weight=0.5)[0]
    torch.testing.assert_close(on_gold, plain)
    assert not torch.allclose(elsewhere, plain)
