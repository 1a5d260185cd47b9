"""The distillation objective of a DFlash / DFlash 2 drafter.

    loss = CE + lambda * selector CE + mu * hidden regression - nu * expected acceptance

CE: cross-entropy of the drafter's logits (through the target's frozen LM head) at every block position
k >= 1, weighted by position (`weighting`: the fixed decay exp(-(k-1)/gamma), or D-PACE's weights from the
drafter's own confidence, trainer/training/position_weights.py), against the regenerated token or, with a teacher signal and
kl_weight > 0, against the mixture (1 - kl_weight) * token + kl_weight * the target's own top-k
distribution at that position (forward KL to the target up to a constant; ModelOpt's default for DFlash).

Hidden regression (EAGLE's feature loss): the drafter's final hidden state at block position k against the
target's final hidden state where it predicted that token, squared error relative to the target's mean
square, same weights. The LM head is linear, so matching it matches every logit at once.

Draft vocabulary (`draft_ids`): a drafter that will draft among the N most frequent tokens only is trained
over exactly those N logits (the EAGLE-3 recipe): the LM-head matmul, the trainer's largest cost by far on
a CPU, shrinks by vocab/N. Positions whose gold token lies outside the draft vocabulary leave the CE term
(the drafter can never propose it) but still count as misses in the metrics, as they do when decoding.

Spec-AUF (`first_failure_only`): within each block, positions after the first one the drafter currently
gets wrong leave the CE term: a verifier never reaches them, so their gradient only spends capacity.

Selector CE (DFlash 2): a K-way cross-entropy over the top-K candidates of each position, scored from the
gold predecessor (teacher forcing), with the same weights. Policy when the gold token is not among the
top-K: the position is left out of the selector term (the walk could not have picked it whatever the
selector learned) and counted against `topk_recall`; the CE term is what moves such tokens into the top-K.
For D-PACE and the acceptance term such a position is a miss (acceptance 0), never padding.

Expected acceptance (`acceptance_loss_weight` nu > 0): minus E[accepted positions] per block, through each
position's probability of proposing the gold token (position_weights.py), beside the cross-entropy.

The target's embedding and LM head are frozen and deliberately not submodules: DeepSpeed neither
optimises nor partitions them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from kernels.linear_cross_entropy import row_cross_entropy
from schemas import recipe
from trainer.drafter.attention import attention_dtype
from trainer.drafter.model import Drafter
from trainer.training.blocks import BlockBatch
from trainer.training.position_weights import acceptance_loss, dpace_weights, to_grid


def bf16_matmuls_pay_off(device: torch.device | str) -> bool:
    """Whether bfloat16 matmuls are faster than float32 ones here: on GPUs yes; on CPUs only with native bfloat16
    instructions (AVX512-BF16 or AMX; measured on an AVX2 EPYC: a 1536x576 by 576x49152 product 0.79 s in float32,
    5.9 s in bfloat16)."""
    device = torch.device(device)
    if device.type != "cpu":
        return True
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: trust oneDNN's answer
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class FrozenTargetParts:
    embedding: torch.Tensor
    lm_head: torch.Tensor


class DistillationObjective(nn.Module):
    def __init__(self, drafter: Drafter, frozen: FrozenTargetParts, selector_loss_weight: float = 1.0,
                 kl_weight: float = 0.0, hidden_loss_weight: float = 0.0, bf16_matmuls: bool = False,
                 draft_ids: torch.Tensor | None = None, first_failure_only: bool = False,
                 weighting: recipe.PositionWeighting = recipe.POSITION_WEIGHTING,
                 dpace_alpha: float = recipe.DPACE_ALPHA, acceptance_loss_weight: float = recipe.ACCEPTANCE_LOSS_WEIGHT):
        super().__init__()
        self.weighting = weighting
        self.dpace_alpha = dpace_alpha
        self.acceptance_loss_weight = acceptance_loss_weight
        self.drafter = drafter
        self.frozen = frozen
        self.selector_loss_weight = selector_loss_weight
        self.kl_weight = kl_weight
        self.hidden_loss_weight = hidden_loss_weight
        self.first_failure_only = first_failure_only
        # float32 weights on a CPU with bfloat16 matmul units: run the matmuls (the drafter's under autocast,
        # the LM head's from a bfloat16 copy) in bfloat16, ~2x faster; weights, optimizer, softmax and
        # losses stay float32. Without such units (AVX2) bfloat16 is emulated, ~7x slower: stay in float32.
        self.low_precision = (bf16_matmuls and frozen.lm_head.dtype == torch.float32
                              and bf16_matmuls_pay_off(frozen.lm_head.device))
        self.draft_ids = draft_ids
        head = frozen.lm_head.detach()  # a plain tensor, never a registered (or optimised) parameter
        if draft_ids is not None:
            head = head[draft_ids.to(head.device)]
        self.ce_head = head.to(torch.bfloat16) if self.low_precision else head.contiguous()
        self.to_draft = None  # target id -> draft id, -1 outside the draft vocabulary
        if draft_ids is not None:
            self.to_draft = torch.full((frozen.lm_head.shape[0],), -1, dtype=torch.long, device=head.device)
            self.to_draft[draft_ids.to(head.device)] = torch.arange(len(draft_ids), device=head.device)

    def forward(self, batch: BlockBatch) -> dict[str, torch.Tensor]:
        device = self.frozen.lm_head.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=self.low_precision):
            return self._forward(batch)

    def _forward(self, batch: BlockBatch) -> dict[str, torch.Tensor]:
        drafter, frozen = self.drafter, self.frozen
        dtype = frozen.lm_head.dtype
        context = batch.context.to(dtype)
        width = context.shape[1]
        context_positions = torch.arange(width, device=context.device).expand(context.shape[0], -1)
        hidden = drafter(
            drafter.embed_block(batch.block_ids, frozen.embedding), batch.block_positions, context,
            context_positions, mask=batch.attention_bias(attention_dtype(context)), block_len=batch.block_size,
        )
        # Only supervised positions go through the (large) LM head.
        supervised = batch.weights.view(-1) > 0
        hidden = hidden.reshape(-1, hidden.shape[-1])[supervised]
        labels = batch.labels.reshape(-1)[supervised]
        weights = batch.weights.reshape(-1)[supervised].float()
        selector = drafter.candidate_selector
        top_k = drafter.config.selector_top_k if selector is not None else 0
        soft = {}
        if self.kl_weight and batch.soft_ids is not None:
            soft = {"soft_ids": batch.soft_ids.flatten(0, 2)[supervised],
                    "soft_probs": torch.softmax(batch.soft_logits.flatten(0, 2)[supervised].float(), dim=-1),
                    "soft_weight": self.kl_weight}
        if self.to_draft is not None:  # the CE runs over the draft vocabulary's columns
            ce_labels = self.to_draft[labels]
            weights = weights * (ce_labels >= 0)
            ce_labels = ce_labels.clamp_min(0)
            if soft:
                soft_ids = self.to_draft[soft["soft_ids"]]
                probs = soft["soft_probs"] * (soft_ids >= 0)
                soft.update(soft_ids=soft_ids.clamp_min(0), soft_probs=probs / probs.sum(-1, keepdim=True).clamp_min(1e-9))
        else:
            ce_labels = labels
        row_ce, predicted, candidates = row_cross_entropy(hidden.to(self.ce_head.dtype), self.ce_head, ce_labels,
                                                          top_k=top_k, **soft)
        if self.draft_ids is not None:  # back to target ids
            predicted = self.draft_ids[predicted]
            candidates = None if candidates is None else self.draft_ids[candidates]
        # In the sequence, supervised, and proposable from the draft vocabulary (before Spec-AUF prunes positions).
        draftable = weights > 0
        if self.first_failure_only:
            weights = weights * reached(batch, supervised, predicted == labels)
        selected = None
        if selector is not None:
            selected = self._selector_terms(hidden, candidates, labels, batch.predecessors.reshape(-1)[supervised])
            predicted = selected["predicted"]
        # The probability the drafter proposes the gold token at each position given a correct prefix (0 where it
        # cannot propose it): the selector's among the top-K for DFlash 2, the LM head's for DFlash. With a
        # teacher mixture (kl_weight) the LM head's is approximated by exp(-its mixed cross-entropy).
        # Only D-PACE and the acceptance term read it; the fixed decay does without.
        acceptance = None
        if self.weighting == "dpace" or self.acceptance_loss_weight:
            proposes = torch.exp(-selected["loss"]) * selected["in_top_k"] if selected is not None else torch.exp(-row_ce)
            acceptance = proposes * draftable
        valid = batch.weights > 0
        if acceptance is not None and self.weighting == "dpace":
            dpace = dpace_weights(to_grid(acceptance.detach(), supervised, valid.shape), valid, self.dpace_alpha)
            weights = dpace.reshape(-1)[supervised] * (weights > 0)
        ce = (row_ce * weights).sum() / weights.sum().clamp_min(1e-9)
        out = {"ce": ce.detach(), "loss": ce}
        if self.hidden_loss_weight and batch.teacher_hidden is not None:
            goal = batch.teacher_hidden.flatten(0, 2)[supervised].float()
            error = (hidden.float() - goal).pow(2).mean(-1) / goal.pow(2).mean().clamp_min(1e-6)
            hidden_loss = (error * weights).sum() / weights.sum()
            out["loss"] = out["loss"] + self.hidden_loss_weight * hidden_loss
            out["hidden_loss"] = hidden_loss.detach()
        if selected is not None:
            selector_weights = weights * selected["in_top_k"]
            selector_ce = (selected["loss"] * selector_weights).sum() / selector_weights.sum().clamp_min(1e-6)
            out["loss"] = out["loss"] + self.selector_loss_weight * selector_ce
            out.update(selector_ce=selector_ce.detach(), topk_recall=selected["in_top_k"].float().mean().detach())
        if acceptance is not None and self.acceptance_loss_weight:
            term, expected_tau = acceptance_loss(to_grid(acceptance, supervised, valid.shape), valid)
            out["loss"] = out["loss"] + self.acceptance_loss_weight * term
            out["expected_tau"] = expected_tau
        out["correct"] = predicted == labels
        out["supervised"] = supervised
        return out

    def _selector_terms(self, hidden: torch.Tensor, candidates: torch.Tensor, labels: torch.Tensor,
                        predecessors: torch.Tensor) -> dict[str, torch.Tensor]:
        """DFlash 2's selector at each supervised position: its K-way cross-entropy against the gold candidate
        (per position), whether the gold token is among the top-K, and what greedy inference would pick given a
        correct prefix."""
        selector = self.drafter.candidate_selector
        # The candidates' logits again, now with a gradient path (K per position: cheap).
        unary = torch.einsum("ph,pkh->pk", hidden, self.frozen.lm_head[candidates])
        scores = selector(hidden, unary, candidates, predecessors)
        gold = candidates == labels[:, None]
        loss = F.cross_entropy(scores.float(), gold.float().argmax(-1), reduction="none")
        predicted = candidates.gather(-1, scores.argmax(-1, keepdim=True))[:, 0].detach()
        return {"loss": loss, "in_top_k": gold.any(-1), "predicted": predicted}


def reached(batch: BlockBatch, supervised: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """1 for each supervised position whose block predecessors (positions 1..k-1) are all predicted right."""
    grid = torch.zeros(batch.weights.numel(), dtype=torch.bool, device=correct.device)
    grid[supervised] = correct
    grid = grid.view(batch.weights.shape)
    before = torch.ones_like(grid)
    before[..., 2:] = grid[..., 1:-1].int().cumprod(-1).bool()
    return before.reshape(-1)[supervised].float()


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
