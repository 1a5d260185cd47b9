"""Cross-entropy through a frozen LM head, fused and chunked (the drafter trainer's hottest op).

The plain way materialises (positions x vocabulary) logits, their log-softmax and, in backward, a
gradient of the same size: for 1,300 positions and a 49k vocabulary that is ~250 MB per tensor, and
filling and reading them costs as much as the matmuls. The fused op walks the positions in chunks and,
since the loss is linear in the per-position terms, computes the gradient w.r.t. the hidden states in
the forward pass (softmax - onehot, times the head), keeping only that (positions x hidden) result.
The head must be frozen: no gradient flows to it.

Both functions return (weighted loss, argmax prediction per row, top-k indices per row or None).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def linear_cross_entropy_reference(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor,
                                   row_weights: torch.Tensor, top_k: int = 0):
    """sum_i row_weights[i] * CE(hidden[i] @ head.T, labels[i]) the plain way."""
    logits = (hidden @ head.T).float()
    loss = (F.cross_entropy(logits, labels, reduction="none") * row_weights).sum()
    top = logits.detach().topk(top_k, dim=-1).indices if top_k else None
    return loss, logits.detach().argmax(-1), top


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, labels, row_weights, top_k: int, chunk: int):
        rows = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        predicted = torch.empty(rows, dtype=torch.long, device=hidden.device)
        top = torch.empty(rows, top_k, dtype=torch.long, device=hidden.device) if top_k else None
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk)
            logits = (hidden[start:end] @ head.T).float()
            weights = row_weights[start:end].float()
            log_z = torch.logsumexp(logits, dim=-1)
            gold = logits.gather(-1, labels[start:end, None])[:, 0]
            loss += ((log_z - gold) * weights).sum()
            predicted[start:end] = logits.argmax(-1)
            if top_k:
                top[start:end] = logits.topk(top_k, dim=-1).indices
            # d loss / d logits = w * (softmax - onehot), reusing the logits buffer.
            probs = logits.sub_(log_z[:, None]).exp_()
            probs[torch.arange(end - start, device=probs.device), labels[start:end]] -= 1.0
            probs.mul_(weights[:, None])
            grad_hidden[start:end] = (probs.to(head.dtype) @ head).to(hidden.dtype)
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(predicted, *([top] if top is not None else []))
        return loss, predicted, top

    @staticmethod
    def backward(ctx, grad_loss, _grad_predicted, _grad_top):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, row_weights: torch.Tensor,
                         top_k: int = 0, chunk: int = 256):
    """Fused, chunked equivalent of linear_cross_entropy_reference (head must not require grad)."""
    if head.requires_grad:
        raise ValueError("linear_cross_entropy trains through a frozen head only")
    return _FusedLinearCrossEntropy.apply(hidden, head, labels, row_weights, top_k, chunk)
