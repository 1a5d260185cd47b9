"""Triton kernels for the candidate selector's edge scores (kernels/selector.py is the reference).

    S[p, k] = U[p, k] + sum_r A[a_p, r] * Wh[p, r] * B[b_pk, r]

with a_p the predecessor token of position p, b_pk its k-th candidate, A / B the predecessor / successor
codebooks (V, r) and Wh the projected hidden state (P, r). torch's version gathers A[a] (P, r) and B[b]
(P, K, r) into fresh tensors, multiplies, and in backward scatters (P, K, r) rows back through
embedding_backward's sort; here each program reads the codebook rows in place and never writes the gathers.
Gradients, with dS = d loss / d S and q[p] = A[a_p] * Wh[p]:

    dU = dS;   dq[p, r] = sum_k dS[p, k] * B[b_pk, r];   dWh = dq * A[a_p];   dA[a_p] += dq * Wh[p];
    dB[b_pk] += dS[p, k] * q[p]

One program per position: K (16) candidates x BLOCK_R rank columns a step, the rank in a loop (r = 256 is
two steps of 128). Sums are float32. The codebook gradients are scatter-adds (the same token is a candidate
at many positions), done with float32 atomics into a float32 buffer cast to the codebook's dtype at the end:
float addition order then varies run to run on a GPU (by float32 rounding only). Backward recomputes q
(two loads and a multiply) rather than saving a (P, r) tensor.
The walk (selector_walk) stays in torch and calls edge_scores, which dispatches here on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton import next_power_of_2


@triton.jit
def _edge_forward(unary_ptr, cand_ptr, hid_ptr, pred_ptr, a_ptr, b_ptr, out_ptr, K, R,
                  BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < K
    cand = tl.load(cand_ptr + p * K + k, mask=k_ok, other=0).to(tl.int64)
    pred = tl.load(pred_ptr + p).to(tl.int64)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_ok = r < R
        q = tl.load(a_ptr + pred * R + r, mask=r_ok, other=0.0).to(tl.float32) \
            * tl.load(hid_ptr + p * R + r, mask=r_ok, other=0.0).to(tl.float32)
        keys = tl.load(b_ptr + cand[:, None] * R + r[None, :], mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        acc += tl.sum(keys.to(tl.float32) * q[None, :], axis=1)
    unary = tl.load(unary_ptr + p * K + k, mask=k_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + p * K + k, (unary + acc).to(out_ptr.dtype.element_ty), mask=k_ok)


@triton.jit
def _edge_backward(dscore_ptr, cand_ptr, hid_ptr, pred_ptr, a_ptr, b_ptr, dhid_ptr, da_ptr, db_ptr, K, R,
                   NEED_HID: tl.constexpr, NEED_A: tl.constexpr, NEED_B: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < K
    cand = tl.load(cand_ptr + p * K + k, mask=k_ok, other=0).to(tl.int64)
    pred = tl.load(pred_ptr + p).to(tl.int64)
    ds = tl.load(dscore_ptr + p * K + k, mask=k_ok, other=0.0).to(tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_ok = r < R
        both = k_ok[:, None] & r_ok[None, :]
        a_row = tl.load(a_ptr + pred * R + r, mask=r_ok, other=0.0).to(tl.float32)
        hid = tl.load(hid_ptr + p * R + r, mask=r_ok, other=0.0).to(tl.float32)
        if NEED_HID or NEED_A:
            keys = tl.load(b_ptr + cand[:, None] * R + r[None, :], mask=both, other=0.0).to(tl.float32)
            dq = tl.sum(keys * ds[:, None], axis=0)
            if NEED_HID:
                tl.store(dhid_ptr + p * R + r, (dq * a_row).to(dhid_ptr.dtype.element_ty), mask=r_ok)
            if NEED_A:
                tl.atomic_add(da_ptr + pred * R + r, dq * hid, mask=r_ok)
        if NEED_B:
            tl.atomic_add(db_ptr + cand[:, None] * R + r[None, :], ds[:, None] * (a_row * hid)[None, :], mask=both)


def _block_r(rank: int) -> int:
    return min(next_power_of_2(rank), 128)  # 16 x 128 float32 keys per step: a comfortable register tile


class TritonEdgeScores(torch.autograd.Function):
    """unary, candidates: (P, K); projected_hidden: (P, r); predecessors: (P,); codebooks: (V, r)."""

    @staticmethod
    def forward(ctx, unary, candidates, projected_hidden, predecessors, predecessor_codebook, successor_codebook):
        unary, candidates = unary.contiguous(), candidates.contiguous()
        projected_hidden, predecessors = projected_hidden.contiguous(), predecessors.contiguous()
        a_book, b_book = predecessor_codebook.contiguous(), successor_codebook.contiguous()
        positions, top_k = candidates.shape
        rank = a_book.shape[1]
        # The reference's dtype: unary + (codebook row * projected hidden) . codebook row, under type promotion.
        dtype = torch.promote_types(unary.dtype, torch.promote_types(
            torch.promote_types(a_book.dtype, projected_hidden.dtype), b_book.dtype))
        out = torch.empty(positions, top_k, dtype=dtype, device=unary.device)
        if out.numel():
            _edge_forward[(positions,)](unary, candidates, projected_hidden, predecessors, a_book, b_book, out,
                                        top_k, rank, BLOCK_K=next_power_of_2(top_k), BLOCK_R=_block_r(rank))
        ctx.save_for_backward(candidates, projected_hidden, predecessors, a_book, b_book)
        ctx.unary_dtype = unary.dtype
        return out

    @staticmethod
    def backward(ctx, grad_scores):
        candidates, projected_hidden, predecessors, a_book, b_book = ctx.saved_tensors
        need_unary, _, need_hid, _, need_a, need_b = ctx.needs_input_grad
        positions, top_k = candidates.shape
        rank = a_book.shape[1]
        grad_scores = grad_scores.contiguous()
        dhid = torch.empty_like(projected_hidden) if need_hid else None
        da = torch.zeros(a_book.shape, dtype=torch.float32, device=a_book.device) if need_a else None
        db = torch.zeros(b_book.shape, dtype=torch.float32, device=b_book.device) if need_b else None
        if (need_hid or need_a or need_b) and grad_scores.numel():
            dummy = grad_scores  # never written: its NEED_ flag is off
            _edge_backward[(positions,)](
                grad_scores, candidates, projected_hidden, predecessors, a_book, b_book,
                dhid if need_hid else dummy, da if need_a else dummy, db if need_b else dummy, top_k, rank,
                NEED_HID=need_hid, NEED_A=need_a, NEED_B=need_b,
                BLOCK_K=next_power_of_2(top_k), BLOCK_R=_block_r(rank))
        return (grad_scores.to(ctx.unary_dtype) if need_unary else None, None, dhid, None,
                None if da is None else da.to(a_book.dtype), None if db is None else db.to(b_book.dtype))


def triton_edge_scores(unary, candidates, projected_hidden, predecessors, predecessor_codebook, successor_codebook):
    """Same signature and shapes as kernels.selector.edge_scores: unary, candidates (..., K); projected_hidden
    (..., r); predecessors (...,). Returns (..., K)."""
    *lead, top_k = candidates.shape
    rank = projected_hidden.shape[-1]
    unary, candidates = torch.broadcast_tensors(unary, candidates)
    scores = TritonEdgeScores.apply(unary.reshape(-1, top_k), candidates.reshape(-1, top_k),
                                    projected_hidden.reshape(-1, rank), predecessors.reshape(-1),
                                    predecessor_codebook, successor_codebook)
    return scores.reshape(*lead, top_k)
