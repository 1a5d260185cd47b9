"""The fused, chunked cross-entropy through a frozen head against the plain computation."""

from __future__ import annotations

import pytest
import torch

from kernels.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_reference


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_matches_the_plain_computation(chunk):
    torch.manual_seed(0)
    rows, hidden_size, vocab = 50, 24, 301
    head = torch.randn(vocab, hidden_size)
    labels = torch.randint(0, vocab, (rows,))
    weights = torch.rand(rows)
    weights /= weights.sum()
    start = torch.randn(rows, hidden_size)
    results = []
    for function in (linear_cross_entropy_reference, linear_cross_entropy):
        hidden = start.clone().requires_grad_(True)
        kwargs = {"chunk": chunk} if function is linear_cross_entropy else {}
        loss, predicted, top = function(hidden, head, labels, weights, top_k=5, **kwargs)
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
