"""The distillation objective of a DFlash / DFlash 2 drafter.

    loss = CE + lambda * selector CE

CE: cross-entropy of the drafter's logits (through the target's frozen LM head) against the regenerated
token at every block position k >= 1, weighted by exp(-(k-1)/gamma).

Selector CE (DFlash 2): a K-way cross-entropy over the top-K candidates of each position, scored from the
gold predecessor (teacher forcing), with the same weights. Policy when the gold token is not among the
top-K: the position is left out of the selector term (the walk could not have picked it whatever the
selector learned) and counted against `topk_recall`; the CE term is what moves such tokens into the top-K.

The target's embedding and LM head are frozen and deliberately not submodules: DeepSpeed neither
optimises nor partitions them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kernels.linear_cross_entropy import linear_cross_entropy
from trainer.drafter.model import Drafter
from trainer.training.blocks import BlockBatch


@dataclass(frozen=True)
class FrozenTargetParts:
    embedding: torch.Tensor
    lm_head: torch.Tensor


class DistillationObjective(nn.Module):
    def __init__(self, drafter: Drafter, frozen: FrozenTargetParts, selector_loss_weight: float = 1.0):
        super().__init__()
        self.drafter = drafter
        self.frozen = frozen
        self.selector_loss_weight = selector_loss_weight

    def forward(self, batch: BlockBatch) -> dict[str, torch.Tensor]:
        drafter, frozen = self.drafter, self.frozen
        dtype = frozen.lm_head.dtype
        context = batch.context.to(dtype)
        width = context.shape[1]
        context_positions = torch.arange(width, device=context.device).expand(context.shape[0], -1)
        hidden = drafter(
            drafter.embed_block(batch.block_ids, frozen.embedding), batch.block_positions, context,
            context_positions, mask=batch.mask, block_len=batch.block_size,
        )
        # Only supervised positions go through the (large) LM head.
        supervised = batch.weights.view(-1) > 0
        hidden = hidden.reshape(-1, hidden.shape[-1])[supervised]
        labels = batch.labels.reshape(-1)[supervised]
        weights = batch.weights.reshape(-1)[supervised].float()
        selector = drafter.candidate_selector
        top_k = drafter.config.selector_top_k if selector is not None else 0
        ce, predicted, candidates = linear_cross_entropy(hidden, frozen.lm_head, labels, weights / weights.sum(),
                                                         top_k=top_k)
        out = {"ce": ce.detach(), "loss": ce}
        if selector is not None:
            # The candidates' logits again, now with a gradient path (K per position: cheap).
            unary = torch.einsum("ph,pkh->pk", hidden, frozen.lm_head[candidates])
            scores = selector(hidden, unary, candidates, batch.predecessors.reshape(-1)[supervised])
            gold = candidates == labels[:, None]
            in_top_k = gold.any(-1)
            selector_loss = F.cross_entropy(scores.float(), gold.float().argmax(-1), reduction="none")
            selector_weights = weights * in_top_k
            selector_ce = (selector_loss * selector_weights).sum() / selector_weights.sum().clamp_min(1e-6)
            out["loss"] = ce + self.selector_loss_weight * selector_ce
            # What greedy inference would pick at this position given a correct prefix.
            predicted = candidates.gather(-1, scores.argmax(-1, keepdim=True))[:, 0].detach()
            out.update(selector_ce=selector_ce.detach(), topk_recall=in_top_k.float().mean().detach())
        out["correct"] = predicted == labels
        out["supervised"] = supervised
        return out


def block_metrics(batch: BlockBatch, out: dict[str, torch.Tensor]) -> dict[str, object]:
    """Per-position accuracy and the acceptance length greedy decoding would reach on these blocks."""
    shape = batch.weights.shape
    correct = torch.zeros(shape, dtype=torch.bool).view(-1)
    correct[out["supervised"].cpu()] = out["correct"].cpu()
    correct = correct.view(shape)[..., 1:]
    valid = (batch.weights > 0)[..., 1:].cpu()
    per_position = (correct & valid).sum((0, 1)) / valid.sum((0, 1)).clamp_min(1)
    # Accepted prefix per block: drafts count while they are right (positions past the sequence end
    # cannot be accepted). +1 for the bonus token, as tau counts it.
    live_blocks = valid[..., 0]
    accepted = (correct & valid).int().cumprod(-1).sum(-1)
    tau = 1 + accepted[live_blocks].float().mean() if live_blocks.any() else torch.tensor(1.0)
    return {"accuracy_per_position": [round(float(a), 4) for a in per_position],
            "train_tau_estimate": float(tau)}
