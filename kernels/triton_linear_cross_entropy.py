"""Triton kernels for the draft-vocabulary cross-entropy (kernels/linear_cross_entropy.py is the reference).

Per row i (hidden h_i, head W of shape (V, H)), with target distribution t_i over a few ids (the gold label,
plus the teacher's top-k when distilling):

    loss_i = lse_i - sum_j t_ij * z_i[id_ij],   z_i = W h_i,   lse_i = log sum_v exp z_i[v]

The torch path materialises a (chunk x V) float32 logit block per row chunk (~200 MB at V = 49k); here no
logit leaves the registers:

  forward   `_lse_forward`: a program owns BLOCK_M rows and a contiguous range of vocabulary tiles (the
            vocabulary is split so the grid fills the GPU even for few rows). Per BLOCK_V tile it computes
            the logits with tl.dot over BLOCK_H slices of H (float32 accumulation), folds them into an online
            max / sum-exp, and keeps the running argmax and top-k as packed int64 keys (float bits in the
            high half, made order-preserving, 2^31-1 - column in the low half, so a larger key is a larger
            logit and, on a tie, the lower column, as torch picks). torch then merges the few per-split
            partials (logsumexp of the splits, max / topk of the keys). The target logits z_i[id_ij] are a
            gather-and-dot of 1 + S head rows per row, done in torch: no need to find them in the tiles.
  backward  `_lse_backward`: d loss_i / d z_i = g_i * (softmax_i - t_i). The softmax part is recomputed per
            (BLOCK_M, BLOCK_V) tile from the saved lse (the logits are recomputed: one more matmul, in exchange
            for never storing them), then multiplied back by W (grad hidden) and by h (grad head, when the head
            is trainable) and added with float32 atomics into float32 buffers. The -g_i * t_i part touches
            1 + S rows per row and is done in torch (a bmm and an index_add_).

The reference computes every row's gradient in its forward pass, which only works for a frozen head; this one
computes gradients in backward and so supports a trainable head too (TritonRowCrossEntropy; the public
row_cross_entropy keeps refusing one, as on CPU). Like the reference: no reduction (per-row float32 losses;
the caller weights them, a zero weight drops a row), no ignore index (the caller clamps and zero-weights),
argmax and top-k returned without gradient, hidden cast to the head's dtype for the matmul, logits and softmax
in float32, the softmax cast to the head's dtype before it meets the head again. float32 inputs use IEEE
float32 dots (not TF32), so float32 results match the reference to float32 rounding.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels._triton import next_power_of_2

_LOW = 0x7FFFFFFF  # column c is stored as _LOW - c in the low 32 bits of a key


@triton.jit
def _keys(logits, cols):
    bits = logits.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed-int order == float order
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)


@triton.jit
def _logit_tile(h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                BLOCK_H: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        a = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _lse_forward(h_ptr, w_ptr, max_ptr, sum_ptr, best_ptr, top_ptr, M, V, H, tiles_per_split,
                 TOP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < M
    run_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    lowest = -9223372036854775807 - 1
    best = tl.full((BLOCK_M,), lowest, dtype=tl.int64)
    top = tl.full((BLOCK_M, TOP), lowest, dtype=tl.int64)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(V, BLOCK_V))
    for tile in range(first, last):
        cols = (tile * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < V
        logits = _logit_tile(h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, BLOCK_M, BLOCK_V, BLOCK_H, PRECISION,
                             UPCAST)
        logits = tl.where(col_ok[None, :], logits, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(logits, axis=1))  # finite: every tile has a real column
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(logits - new_max[:, None]), axis=1)
        run_max = new_max
        keys = tl.where(col_ok[None, :], _keys(logits, cols), lowest)
        best = tl.maximum(best, tl.max(keys, axis=1))
        if TOP > 0:  # the row's top-k is within the union of the running top-k and this tile's
            merged = tl.reshape(tl.join(top, tl.topk(keys, TOP)), (BLOCK_M, 2 * TOP))
            top = tl.topk(merged, TOP)
    out = split.to(tl.int64) * M + rows
    tl.store(max_ptr + out, run_max, mask=row_ok)
    tl.store(sum_ptr + out, run_sum, mask=row_ok)
    tl.store(best_ptr + out, best, mask=row_ok)
    if TOP > 0:
        tl.store(top_ptr + out[:, None] * TOP + tl.arange(0, TOP)[None, :], top, mask=row_ok[:, None])


@triton.jit
def _lse_backward(h_ptr, w_ptr, lse_ptr, g_ptr, dh_ptr, dw_ptr, M, V, H, NEED_H: tl.constexpr,
                  NEED_W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                  PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok, col_ok = rows < M, cols < V
    logits = _logit_tile(h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, BLOCK_M, BLOCK_V, BLOCK_H, PRECISION, UPCAST)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)  # rows past M (and zero-weight rows) contribute nothing
    p = tl.exp(logits - lse[:, None]) * g[:, None]
    p = tl.where(col_ok[None, :], p, 0.0).to(h_ptr.dtype.element_ty)  # as the reference casts its probs
    if UPCAST:
        p = p.to(tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        if NEED_H:
            w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                w = w.to(tl.float32)
            tl.atomic_add(dh_ptr + rows[:, None] * H + ks[None, :], tl.dot(p, w, input_precision=PRECISION),
                          mask=row_ok[:, None] & k_ok[None, :])
        if NEED_W:
            h = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                h = h.to(tl.float32)
            tl.atomic_add(dw_ptr + cols[:, None] * H + ks[None, :], tl.dot(tl.trans(p), h, input_precision=PRECISION),
                          mask=col_ok[:, None] & k_ok[None, :])


def _config(rows: int, vocab: int, hidden: int, top: int, block_v: int | None):
    # 64 x 128 float32 logit tile (32 KB of registers over 4 warps) with 64-wide H slices: the usual shape for a
    # bf16 tl.dot on Ampere/Hopper. The top-k merge needs TOP <= BLOCK_V.
    block_m = min(64, max(16, next_power_of_2(rows)))
    block_v = max(block_v or 128, top, 16)
    block_h = min(64, max(16, next_power_of_2(hidden)))
    return block_m, block_v, block_h


def _dot_options(dtype: torch.dtype) -> dict:
    # Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) multiplies bfloat16 tiles wrongly in tl.dot (it
    # returned ~1e10 for unit-size inputs with triton 3.9), so there the tiles are widened to float32 first. That
    # gives the same numbers a GPU's bf16 dot does (bf16 x bf16 products are exact in float32, the sum is float32),
    # up to summation order. On a GPU the dot takes the 16-bit tiles as they are (tensor cores).
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    upcast = interpreted and dtype != torch.float32
    return {"PRECISION": "ieee" if dtype == torch.float32 or upcast else "tf32", "UPCAST": upcast}


class TritonRowCrossEntropy(torch.autograd.Function):
    """(per-row losses, argmax, top-k or None) of hidden (M, H) through head (V, H); see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, head, labels, top_k: int, soft_ids, soft_probs, soft_weight: float,
                block_v: int | None = None, splits: int | None = None):
        x, head = hidden.to(head.dtype).contiguous(), head.contiguous()
        (rows, width), vocab = x.shape, head.shape[0]
        top = next_power_of_2(top_k) if top_k else 0
        block_m, block_v, block_h = _config(rows, vocab, width, top, block_v)
        tiles = triton.cdiv(vocab, block_v)
        row_blocks = triton.cdiv(rows, block_m)
        if splits is None:  # enough programs for ~2 waves on a 132-SM GPU, each with >= 4 tiles of work
            splits = max(1, min(triton.cdiv(264, row_blocks), tiles // 4))
        per_split = triton.cdiv(tiles, min(splits, tiles))
        splits = triton.cdiv(tiles, per_split)  # no empty split
        f32 = dict(dtype=torch.float32, device=x.device)
        run_max, run_sum = torch.empty(splits, rows, **f32), torch.empty(splits, rows, **f32)
        best = torch.empty(splits, rows, dtype=torch.int64, device=x.device)
        top_keys = torch.empty(splits, rows, max(top, 1), dtype=torch.int64, device=x.device)
        if rows:
            _lse_forward[(row_blocks, splits)](x, head, run_max, run_sum, best, top_keys, rows, vocab, width,
                                               per_split, TOP=top, BLOCK_M=block_m, BLOCK_V=block_v,
                                               BLOCK_H=block_h, **_dot_options(x.dtype))
        lse = torch.logsumexp(run_max + run_sum.log(), dim=0)
        predicted = _LOW - (best.max(0).values & 0xFFFFFFFF)
        top_ids = None
        if top_k:
            keys = top_keys.permute(1, 0, 2).reshape(rows, -1).topk(top_k, dim=-1).values
            top_ids = _LOW - (keys & 0xFFFFFFFF)
        # Target ids and weights: the gold label (1 - soft_weight, or 1) and the teacher's ids (soft_weight * p).
        hard = 1.0 - soft_weight if soft_ids is not None else 1.0
        ids = labels[:, None]
        coef = torch.full((rows, 1), hard, **f32)
        if soft_ids is not None:
            ids = torch.cat([ids, soft_ids], dim=1)
            coef = torch.cat([coef, soft_probs.float() * soft_weight], dim=1)
        with torch.autocast(x.device.type, enabled=False):  # float32 target logits, whatever autocast wants
            target_logits = torch.bmm(head[ids].float(), x.float()[:, :, None])[:, :, 0]  # z_i[id_ij], (M, 1 + S)
        losses = lse - (coef * target_logits).sum(-1)
        ctx.save_for_backward(x, head, lse, ids, coef)
        ctx.hidden_dtype, ctx.block_v = hidden.dtype, block_v
        ctx.mark_non_differentiable(predicted, *([top_ids] if top_ids is not None else []))
        return losses, predicted, top_ids

    @staticmethod
    def backward(ctx, grad_losses, _grad_predicted, _grad_top):
        x, head, lse, ids, coef = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        (rows, width), vocab = x.shape, head.shape[0]
        g = grad_losses.float().contiguous()
        block_m, block_v, block_h = _config(rows, vocab, width, 0, ctx.block_v)
        dh = torch.zeros(rows, width, dtype=torch.float32, device=x.device) if need_h else None
        dw = torch.zeros(vocab, width, dtype=torch.float32, device=x.device) if need_w else None
        if rows and (need_h or need_w):
            _lse_backward[(triton.cdiv(rows, block_m), triton.cdiv(vocab, block_v))](
                x, head, lse, g, dh if need_h else g, dw if need_w else g, rows, vocab, width, NEED_H=need_h,
                NEED_W=need_w, BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_H=block_h, **_dot_options(x.dtype))
        scaled = g[:, None] * coef  # the -g_i * t_ij part of d loss / d logits, on 1 + S columns per row
        if need_h:
            with torch.autocast(x.device.type, enabled=False):
                dh -= torch.bmm(scaled[:, None, :], head[ids].float())[:, 0]
        if need_w:
            dw.index_add_(0, ids.reshape(-1), (-scaled[:, :, None] * x.float()[:, None, :]).reshape(-1, width))
        return (None if dh is None else dh.to(ctx.hidden_dtype), None if dw is None else dw.to(head.dtype),
                None, None, None, None, None, None, None)


def triton_row_cross_entropy(hidden, head, labels, top_k: int = 0, soft_ids=None, soft_probs=None,
                             soft_weight: float = 0.0, block_v: int | None = None, splits: int | None = None):
    """Same results as kernels.linear_cross_entropy.row_cross_entropy; the head may be trainable here.
    block_v / splits: vocabulary tile width and number of vocabulary splits (tests use small ones)."""
    return TritonRowCrossEntropy.apply(hidden, head, labels, top_k, soft_ids, soft_probs, soft_weight, block_v,
                                       splits)
