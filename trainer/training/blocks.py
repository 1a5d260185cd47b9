"""Training blocks: many anchors per sequence, drafted side by side in one forward pass.

For an anchor at index a, the block is `[token[a], MASK x (B-1)]` at positions a .. a+B-1; block
position k >= 1 is trained to predict token[a + k]. Exactly as at inference, the block sees the target's
features of every position strictly before the anchor (the anchor itself has not been through the
target yet when it is drafted from) and, bidirectionally, the rest of its own block — never another
block. Anchors are response tokens whose next token is a response token too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.drafter.attention import empty_bias


def default_decay_gamma(block_size: int) -> float:
    """Loss decay exp(-(k-1)/gamma): the DFlash paper's gammas (7 at B=16, 5 at B=10, 4 at B=8),
    interpolated, so early positions (which gate every later acceptance) weigh the most."""
    return max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0)


@dataclass
class BlockBatch:
    context: torch.Tensor
    """(b, S, taps*H) target features of every sequence position (padding rows are ignored by the mask)."""
    block_ids: torch.Tensor
    """(b, N*B) token ids of the blocks: anchor then mask tokens."""
    block_positions: torch.Tensor
    """(b, N*B) absolute positions of the block tokens."""
    anchors: torch.Tensor
    """(b, N) each block's anchor index (0 for a padding block); with `anchor_valid` all the attention mask needs,
    so the mask is built where the batch is (`attention_bias`), never copied to a GPU."""
    anchor_valid: torch.Tensor
    """(b, N) False for padding blocks (a short sequence's), which see no context."""
    labels: torch.Tensor
    """(b, N, B) token[a + k]; undefined where weight is 0."""
    predecessors: torch.Tensor
    """(b, N, B) token[a + k - 1], the gold predecessor the selector scores from."""
    weights: torch.Tensor
    """(b, N, B) loss weight: decay(k) for valid block positions k >= 1, else 0."""
    soft_ids: torch.Tensor | None = None
    """(b, N, B, k) the target's top-k tokens where it predicted labels[...] (with a teacher signal)."""
    soft_logits: torch.Tensor | None = None
    """(b, N, B, k) their logits."""
    teacher_hidden: torch.Tensor | None = None
    """(b, N, B, H) the target's final hidden state at the position that predicted labels[...]."""

    @property
    def block_size(self) -> int:
        return self.labels.shape[-1]

    @property
    def supervised_positions(self) -> int:
        return int((self.weights > 0).sum())

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """(b, 1, N*B, S + N*B) additive attention bias on the batch's device: 0 where a block query may attend
        (context strictly before its anchor, and its own block, bidirectionally), -inf elsewhere; laid out for the
        fused kernel (trainer/drafter/attention.py)."""
        return block_attention_bias(self.anchors, self.anchor_valid, self.context.shape[1], self.block_size, dtype)

    @property
    def mask(self) -> torch.Tensor:
        """(b, 1, N*B, S + N*B) True where a block query may attend (the bias as a boolean)."""
        return self.attention_bias(torch.float32) == 0


def sample_anchors(input_ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor, num_anchors: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to num_anchors distinct anchors per row, sorted: (anchors (b, N), valid (b, N))."""
    batch, width = input_ids.shape
    index = torch.arange(width)
    # Anchor a needs token a and token a+1 in the response.
    allowed = (index[None] >= prompt_lens[:, None]) & (index[None] <= lengths[:, None] - 2)
    scores = torch.rand(batch, width, generator=generator).masked_fill(~allowed, 2.0)
    count = min(num_anchors, int(allowed.sum(1).max()))
    if count == 0:
        raise ValueError("no sequence in the batch has two consecutive response tokens")
    chosen = scores.argsort(dim=1)[:, :count]
    valid = torch.gather(scores, 1, chosen) < 2.0
    anchors = torch.where(valid, chosen, width).sort(dim=1).values
    valid = anchors < width
    return anchors.masked_fill(~valid, 0), valid


def build_blocks(input_ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor, context: torch.Tensor,
                 *, block_size: int, num_anchors: int, mask_token_id: int, decay_gamma: float,
                 generator: torch.Generator, teacher: dict[str, torch.Tensor] | None = None,
                 supervised_positions: int | None = None) -> BlockBatch:
    """input_ids: (b, S) right-padded; lengths, prompt_lens: (b,); context: (b, S, taps*H); teacher: the
    target's predictions laid out by predicted position (trainer/training/data.py collate_teacher)."""
    batch, width = input_ids.shape
    anchors, valid = sample_anchors(input_ids, lengths, prompt_lens, num_anchors, generator)
    blocks = anchors.shape[1]
    offsets = torch.arange(block_size)
    positions = anchors[..., None] + offsets  # (b, N, B)
    in_sequence = valid[..., None] & (positions < lengths[:, None, None])
    gather_at = positions.clamp(max=width - 1)
    labels = torch.gather(input_ids, 1, gather_at.view(batch, -1)).view(batch, blocks, block_size)
    predecessors = torch.gather(input_ids, 1, (gather_at - 1).clamp_min(0).view(batch, -1)).view_as(labels)
    # Positions past `supervised_positions` get no loss and so cost no LM-head compute: the budget goes to
    # more anchors for the early positions, which gate every acceptance.
    last = block_size - 1 if supervised_positions is None else supervised_positions
    decay = torch.tensor([0.0] + [math.exp(-(k - 1) / decay_gamma) if k <= last else 0.0
                                  for k in range(1, block_size)])
    weights = decay * in_sequence

    block_ids = torch.full((batch, blocks, block_size), mask_token_id, dtype=input_ids.dtype)
    block_ids[..., 0] = torch.gather(input_ids, 1, anchors)

    soft = {}
    if teacher is not None:
        flat = gather_at.view(batch, -1)

        def at_labels(values: torch.Tensor) -> torch.Tensor:
            picked = torch.gather(values, 1, flat[..., None].expand(-1, -1, values.shape[-1]))
            return picked.view(batch, blocks, block_size, values.shape[-1])

        soft = {"soft_ids": at_labels(teacher["ids"]), "soft_logits": at_labels(teacher["logits"]),
                "teacher_hidden": at_labels(teacher["final"])}
    return BlockBatch(
        context=context, block_ids=block_ids.view(batch, -1), block_positions=positions.view(batch, -1),
        anchors=anchors, anchor_valid=valid, labels=labels, predecessors=predecessors, weights=weights, **soft,
    )


def block_attention_bias(anchors: torch.Tensor, valid: torch.Tensor, width: int, block_size: int,
                         dtype: torch.dtype) -> torch.Tensor:
    """The additive attention bias of blocks anchored at `anchors` (b, N) over `width` context positions, built on
    the anchors' device (BlockBatch.attention_bias)."""
    batch, blocks = anchors.shape
    queries = blocks * block_size
    bias = empty_bias((batch, 1, queries, width + queries), dtype, anchors.device).fill_(float("-inf"))
    # Context strictly before the query's anchor (none for a padding block).
    query_anchor = anchors.repeat_interleave(block_size, dim=1)[..., None]  # (b, N*B, 1)
    query_valid = valid.repeat_interleave(block_size, dim=1)[..., None]
    sees_context = (torch.arange(width, device=anchors.device) < query_anchor) & query_valid
    bias[:, 0, :, :width].masked_fill_(sees_context, 0.0)
    # The query's own block, bidirectionally: the diagonal blocks of the (N x B) x (N x B) block part.
    own = bias[:, 0, :, width:].unflatten(1, (blocks, block_size)).unflatten(-1, (blocks, block_size))
    torch.diagonal(own, dim1=1, dim2=3).fill_(0.0)
    return bias
