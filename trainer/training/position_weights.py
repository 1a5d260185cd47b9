"""How much each block position counts in the drafter's loss, and the expected acceptance length it trains for.

A verifier accepts draft position j only if positions 1..j-1 were accepted too, so position j's loss matters in
proportion to how often decoding reaches it. Two schemes weigh that:

- `decay`: a fixed exp(-(k-1)/gamma) per position (the DFlash paper's; trainer/training/blocks.py builds it).
- `dpace` (D-PACE, Dynamic Position-Aware Cross-Entropy, arXiv 2605.18810): weights from the drafter's own
  current confidence. With q_i = exp(-CE_i) the probability it gives the right token at position i and the
  smoothed q~_i = (1 - alpha) q_i + alpha, position j weighs w_j = sum_{m >= j} prod_{i <= m} q~_i: the
  expected number of accepted positions that j's correctness gates. The weights are detached (a schedule,
  not a path for gradients) and move signal to whichever position currently limits acceptance.

A position the drafter cannot propose whatever it learns (DFlash 2's selector top-K misses the gold token, or
the gold token lies outside the draft vocabulary) is a *miss*: confidence 0, so q~ = alpha and every later
position's weight shrinks. It is never treated as padding, which would leave the chain as it was and overweight
the positions behind a token decoding would reject.

The expected-acceptance term is the quantity D-PACE's weights differentiate: per block,
E[accepted] = sum_k prod_{j <= k} p_j with p_j the (differentiable) probability of the gold token at j, and
E[tau] = 1 + E[accepted]. Maximising it directly is an optional term beside the cross-entropy.

All functions take grids shaped like BlockBatch.weights, (b, N, B) with position 0 the anchor, and work on
positions 1..B-1.
"""

from __future__ import annotations

import torch

from trainer.training.blocks import default_decay_gamma
from trainer.training.config import TrainConfig


def describe_objective(cfg: TrainConfig, block_size: int) -> dict[str, object]:
    """The objective's settings and a one-line summary, as report.json's `training_objective` records them."""
    term = (f" + {cfg.acceptance_loss_weight:g} x expected acceptance" if cfg.acceptance_loss_weight else "")
    if cfg.position_weighting == "dpace":
        return {"position_weighting": "dpace", "dpace_alpha": cfg.dpace_alpha,
                "acceptance_loss_weight": cfg.acceptance_loss_weight,
                "summary": f"cross-entropy weighted by D-PACE (alpha {cfg.dpace_alpha:g}){term}"}
    gamma = cfg.loss_decay_gamma or default_decay_gamma(block_size)
    return {"position_weighting": "decay", "decay_gamma": gamma, "acceptance_loss_weight": cfg.acceptance_loss_weight,
            "summary": f"cross-entropy weighted by a fixed position decay (gamma {gamma:g}){term}"}


def to_grid(values: torch.Tensor, supervised: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Values of the supervised positions (flat, in `supervised`'s order) laid back onto the (b, N, B) grid,
    0 elsewhere; differentiable in `values`."""
    flat = values.new_zeros(supervised.numel()).masked_scatter(supervised, values)
    return flat.view(shape)


def dpace_weights(confidence: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights on a (b, N, B) grid: `confidence` in [0, 1] per position (0 for a miss), `valid` the
    positions that exist (in the sequence and supervised). Positions 0 and invalid ones weigh 0; a block's chain
    ends at its first invalid position (they only trail: the sequence's end, the supervised horizon)."""
    q = ((1 - alpha) * confidence.detach().float() + alpha) * valid
    q = q[..., 1:]
    reach = q.cumprod(-1)  # prod_{i <= m} q~_i
    weights = reach.flip(-1).cumsum(-1).flip(-1)  # sum_{m >= j}
    return torch.cat([torch.zeros_like(weights[..., :1]), weights], dim=-1) * valid


def expected_accepted(acceptance: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per block, the expected number of accepted draft positions sum_k prod_{j <= k} p_j, given each position's
    acceptance probability on a (b, N, B) grid (differentiable); invalid positions accept nothing."""
    p = (acceptance.float() * valid)[..., 1:]
    return p.cumprod(-1).sum(-1)


def acceptance_loss(acceptance: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mean E[tau]) over the blocks with at least one valid position. The loss is minus the expected
    accepted positions per valid position, in [-1, 0], so its weight reads on the cross-entropy's scale whatever
    the block size."""
    live = valid[..., 1:].any(-1)
    accepted = expected_accepted(acceptance, valid)
    positions = valid[..., 1:].sum(-1).clamp_min(1)
    if not live.any():
        zero = accepted.sum() * 0
        return zero, zero.detach() + 1
    loss = -(accepted[live] / positions[live]).mean()
    return loss, (1 + accepted[live].mean()).detach()
