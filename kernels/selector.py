"""The DFlash 2 candidate selector (plain-torch reference).

The drafter proposes the top-K tokens at every block position. The selector scores the edge from the
token chosen at the previous position (a) to each candidate (b):

    S_t(a, b) = U_t(b) + < A[a] * (W h_t), B[b] >

U is the drafter's logit for b, A and B are rank-r codebooks over the vocabulary and W h_t projects the
drafter's hidden state to rank r. A walk from the anchor picks, position by position, the argmax
(greedy) or a sample from softmax(S_t(a, .) / T); that softmax is the proposal q of rejection sampling.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kernels._triton import use_triton


def edge_scores(
    unary: torch.Tensor,
    candidates: torch.Tensor,
    projected_hidden: torch.Tensor,
    predecessors: torch.Tensor,
    predecessor_codebook: torch.Tensor,
    successor_codebook: torch.Tensor,
) -> torch.Tensor:
    """Scores of every candidate given its predecessor token.

    unary, candidates: (..., K); projected_hidden: (..., r); predecessors: (...,) token ids.
    Returns (..., K).
    """
    if use_triton(unary, projected_hidden, predecessor_codebook, successor_codebook):
        from kernels.triton_selector import triton_edge_scores  # CUDA tensors: kernels/triton_selector.py

        return triton_edge_scores(unary, candidates, projected_hidden, predecessors, predecessor_codebook,
                                  successor_codebook)
    query = F.embedding(predecessors, predecessor_codebook) * projected_hidden
    keys = F.embedding(candidates, successor_codebook)
    return unary + torch.einsum("...r,...kr->...k", query, keys)


def selector_walk(
    logits: torch.Tensor,
    projected_hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    predecessor_codebook: torch.Tensor,
    successor_codebook: torch.Tensor,
    top_k: int,
    temperature: float,
    generator: torch.Generator | None = None,
    vocab_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Walk the block from the anchor.

    logits: (batch, L, V); projected_hidden: (batch, L, r); anchor_ids: (batch,); vocab_ids: (V,) the
    token id of every logit column when the logits cover a draft vocabulary only (None: column = token).
    Returns the chosen tokens (batch, L), the candidates (batch, L, K) as token ids and, when sampling,
    the proposal distributions over the candidates (batch, L, K).
    """
    # Unsorted top-k: the candidate order only matters for exact ties, and it matches the reference.
    unary, candidates = torch.topk(logits, top_k, dim=-1, sorted=False)
    if vocab_ids is not None:
        candidates = vocab_ids[candidates]
    predecessor = anchor_ids
    path, proposals = [], []
    for position in range(logits.shape[1]):
        scores = edge_scores(
            unary[:, position], candidates[:, position], projected_hidden[:, position],
            predecessor, predecessor_codebook, successor_codebook,
        )
        if temperature > 0:
            q = torch.softmax(scores.float() / temperature, dim=-1)
            index = torch.multinomial(q, 1, generator=generator)[:, 0]
            proposals.append(q)
        else:
            index = torch.argmax(scores, dim=-1)
        predecessor = candidates[:, position].gather(-1, index[:, None])[:, 0]
        path.append(predecessor)
    return torch.stack(path, dim=1), candidates, torch.stack(proposals, dim=1) if proposals else None


def selector_top_probability(
    logits: torch.Tensor,
    projected_hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    path: torch.Tensor,
    predecessor_codebook: torch.Tensor,
    successor_codebook: torch.Tensor,
    top_k: int,
    vocab_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The selector's top-1 probability at every position of a walked `path` (batch, L): max_b softmax(S_t(a, b))
    at temperature 1, a being the token the walk chose before t (the anchor at t = 0). It is the drafter's
    confidence score: it depends on the predecessor and the hidden state, never on the token drawn at t itself, so
    a verify length chosen from the scores up to t does not look at the draft it decides about (trainer/speculative.py
    relies on that for exact sampling). At T = 0 it is the chosen candidate's probability. Returns (batch, L)."""
    unary, candidates = torch.topk(logits, top_k, dim=-1, sorted=False)
    if vocab_ids is not None:
        candidates = vocab_ids[candidates]
    predecessors = torch.cat([anchor_ids[:, None], path[:, :-1]], dim=1)
    scores = edge_scores(unary, candidates, projected_hidden, predecessors, predecessor_codebook, successor_codebook)
    return torch.softmax(scores.float(), dim=-1).amax(dim=-1)
