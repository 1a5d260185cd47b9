"""Cross-entropy through a frozen LM head, fused and chunked (the drafter trainer's hottest op).

The plain way materialises (positions x vocabulary) logits, their log-softmax and, in backward, a
gradient of the same size: for 1,300 positions and a 49k vocabulary that is ~250 MB per tensor, and
filling and reading them costs as much as the matmuls. The fused op walks the positions in chunks and,
since each row's loss depends on that row's hidden state only, computes every row's gradient w.r.t. its
hidden state in the forward pass (softmax - target, times the head), keeping only that (positions x
hidden) result; backward scales each row by its upstream gradient. The head must be frozen: no gradient
flows to it.

The target distribution of row i is the gold token, or, for distillation, a mixture

    t_i = (1 - soft_weight) * onehot(labels_i) + soft_weight * sum_j soft_probs[i, j] * onehot(soft_ids[i, j])

(the teacher's top-k distribution), and the loss is sum_i row_weights[i] * (-sum_v t_i[v] log softmax_i[v]).
Because the weights are applied outside the fused op, they may be decided from the op's own predictions
(the trainer's Spec-AUF weighting stops a block's loss after its first wrong prediction).
Both functions return (weighted loss, argmax prediction per row, top-k indices per row or None).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kernels._triton import use_triton


def _target_distribution(rows: int, vocab: int, labels, soft_ids, soft_probs, soft_weight: float, device):
    target = torch.zeros(rows, vocab, device=device)
    target[torch.arange(rows, device=device), labels] = 1.0 - soft_weight if soft_ids is not None else 1.0
    if soft_ids is not None:
        target.scatter_add_(1, soft_ids, soft_probs.float() * soft_weight)
    return target


def linear_cross_entropy_reference(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor,
                                   row_weights: torch.Tensor, top_k: int = 0, soft_ids: torch.Tensor | None = None,
                                   soft_probs: torch.Tensor | None = None, soft_weight: float = 0.0):
    """sum_i row_weights[i] * CE(hidden[i] @ head.T, t_i) the plain way."""
    logits = (hidden @ head.T).float()
    target = _target_distribution(logits.shape[0], logits.shape[1], labels, soft_ids, soft_probs, soft_weight,
                                  logits.device)
    loss = (-(target * F.log_softmax(logits, dim=-1)).sum(-1) * row_weights).sum()
    top = logits.detach().topk(top_k, dim=-1).indices if top_k else None
    return loss, logits.detach().argmax(-1), top


class _FusedRowCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropies (rows,), with each row's gradient computed in the forward pass."""

    @staticmethod
    def forward(ctx, hidden, head, labels, top_k: int, chunk: int, soft_ids, soft_probs, soft_weight: float):
        rows = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        losses = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        predicted = torch.empty(rows, dtype=torch.long, device=hidden.device)
        top = torch.empty(rows, top_k, dtype=torch.long, device=hidden.device) if top_k else None
        hard = 1.0 - soft_weight if soft_ids is not None else 1.0
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk)
            logits = (hidden[start:end] @ head.T).float()
            log_z = torch.logsumexp(logits, dim=-1)
            # -sum_v t[v] log softmax[v] = log_z - sum_v t[v] logit[v], as t sums to 1.
            expected = hard * logits.gather(-1, labels[start:end, None])[:, 0]
            if soft_ids is not None:
                probs_soft = soft_probs[start:end].float() * soft_weight
                expected = expected + (logits.gather(-1, soft_ids[start:end]) * probs_soft).sum(-1)
            losses[start:end] = log_z - expected
            predicted[start:end] = logits.argmax(-1)
            if top_k:
                top[start:end] = logits.topk(top_k, dim=-1).indices
            # d loss_i / d logits_i = softmax - t, reusing the logits buffer.
            probs = logits.sub_(log_z[:, None]).exp_()
            probs[torch.arange(end - start, device=probs.device), labels[start:end]] -= hard
            if soft_ids is not None:
                probs.scatter_add_(1, soft_ids[start:end], -probs_soft)
            grad_hidden[start:end] = (probs.to(head.dtype) @ head).to(hidden.dtype)
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(predicted, *([top] if top is not None else []))
        return losses, predicted, top

    @staticmethod
    def backward(ctx, grad_losses, _grad_predicted, _grad_top):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_losses[:, None].to(grad_hidden.dtype), None, None, None, None, None, None, None


def row_cross_entropy(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, top_k: int = 0,
                      chunk: int = 256, soft_ids: torch.Tensor | None = None, soft_probs: torch.Tensor | None = None,
                      soft_weight: float = 0.0):
    """(per-row cross-entropies, argmax per row, top-k per row or None), fused and chunked."""
    if head.requires_grad:
        raise ValueError("linear_cross_entropy trains through a frozen head only")
    if (soft_ids is None) != (soft_probs is None):
        raise ValueError("soft_ids and soft_probs go together")
    if use_triton(hidden, head):  # CUDA tensors: kernels/triton_linear_cross_entropy.py (`chunk` does not apply)
        from kernels.triton_linear_cross_entropy import triton_row_cross_entropy

        return triton_row_cross_entropy(hidden, head, labels, top_k, soft_ids, soft_probs, soft_weight)
    return _FusedRowCrossEntropy.apply(hidden, head, labels, top_k, chunk, soft_ids, soft_probs, soft_weight)


def linear_cross_entropy(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, row_weights: torch.Tensor,
                         top_k: int = 0, chunk: int = 256, soft_ids: torch.Tensor | None = None,
                         soft_probs: torch.Tensor | None = None, soft_weight: float = 0.0):
    """Fused, chunked equivalent of linear_cross_entropy_reference (head must not require grad)."""
    losses, predicted, top = row_cross_entropy(hidden, head, labels, top_k, chunk, soft_ids, soft_probs, soft_weight)
    return (losses * row_weights.float()).sum(), predicted, top
