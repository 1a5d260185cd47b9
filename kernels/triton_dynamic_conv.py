"""Triton kernels for DFlash 2's grouped dynamic depthwise convolution (kernels/dynamic_conv.py is the reference).

    out[r, t, c] = sum_o (base[o, c] + delta[r, t, o, c // G]) * x[r, t - o, c]        (x[r, t - o] = 0 if t < o)

The op is elementwise plus a few shifted reads, so it is bound by memory traffic: torch's version makes
~4 passes over x per tap (pad, multiply, addcmul, add); this one reads x, delta and base once per tap and
writes out once. Gradients, with dout = d loss / d out:

    dx[r, s, c]        = sum_o (base[o, c] + delta[r, s + o, o, c // G]) * dout[r, s + o, c]   (s + o < L)
    ddelta[r, t, o, g] = sum_{c in group g} dout[r, t, c] * x[r, t - o, c]
    dbase[o, c]        = sum_{r, t} dout[r, t, c] * x[r, t - o, c]

Backward recomputes nothing expensive: it re-reads x (saved, not copied) for the products. Each program
covers one row (block), BLOCK_L positions and BLOCK_H channels; BLOCK_H is a multiple of the group size so
a group's channel sum for ddelta stays inside one program (a register reshape + sum, no atomics). dbase is
a sum over every row: each program writes its partial (taps, BLOCK_H) sum to a scratch buffer, summed by
torch afterwards (deterministic, unlike float atomics). All arithmetic is float32 whatever the input
dtype (the reference computes in x's dtype, so bfloat16 results differ by bfloat16 rounding only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton import next_power_of_2


@triton.jit
def _conv_forward(x_ptr, delta_ptr, base_ptr, out_ptr, L, H, GROUPS,
                  G: tl.constexpr, TAPS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr):
    row, t_block, h_block = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    t = t_block * BLOCK_L + tl.arange(0, BLOCK_L)
    c = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok, c_ok = t < L, c < H
    here = t_ok[:, None] & c_ok[None, :]
    x_row = x_ptr + row * L * H
    d_row = delta_ptr + row * L * TAPS * GROUPS
    acc = tl.zeros((BLOCK_L, BLOCK_H), dtype=tl.float32)
    for o in tl.static_range(TAPS):
        src = t - o  # taps look backwards only and never leave the row (block)
        xs = tl.load(x_row + src[:, None] * H + c[None, :], mask=here & (src >= 0)[:, None], other=0.0)
        d = tl.load(d_row + t[:, None] * (TAPS * GROUPS) + o * GROUPS + (c // G)[None, :], mask=here, other=0.0)
        b = tl.load(base_ptr + o * H + c, mask=c_ok, other=0.0)
        acc += (b.to(tl.float32)[None, :] + d.to(tl.float32)) * xs.to(tl.float32)
    tl.store(out_ptr + row * L * H + t[:, None] * H + c[None, :], acc.to(out_ptr.dtype.element_ty), mask=here)


@triton.jit
def _conv_backward(x_ptr, delta_ptr, base_ptr, dout_ptr, dx_ptr, ddelta_ptr, dbase_part_ptr, L, H, GROUPS,
                   G: tl.constexpr, TAPS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr):
    row, t_block, h_block = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    t = t_block * BLOCK_L + tl.arange(0, BLOCK_L)
    c = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok, c_ok = t < L, c < H
    here = t_ok[:, None] & c_ok[None, :]
    x_row, dout_row = x_ptr + row * L * H, dout_ptr + row * L * H
    d_row = delta_ptr + row * L * TAPS * GROUPS
    dd_row = ddelta_ptr + row * L * TAPS * GROUPS
    GROUPS_HERE: tl.constexpr = BLOCK_H // G
    g_here = h_block * GROUPS_HERE + tl.arange(0, GROUPS_HERE)
    dout = tl.load(dout_row + t[:, None] * H + c[None, :], mask=here, other=0.0).to(tl.float32)
    dx = tl.zeros((BLOCK_L, BLOCK_H), dtype=tl.float32)
    # The partial dbase of this program: row-major (programs, TAPS, H), program = (row, t_block).
    part = dbase_part_ptr + (row * tl.num_programs(1) + t_block) * TAPS * H
    for o in tl.static_range(TAPS):
        b = tl.load(base_ptr + o * H + c, mask=c_ok, other=0.0).to(tl.float32)
        # dx at s gathers the outputs at s + o that read it through tap o.
        dst = t + o
        later = here & (dst < L)[:, None]
        dout_later = tl.load(dout_row + dst[:, None] * H + c[None, :], mask=later, other=0.0).to(tl.float32)
        d_later = tl.load(d_row + dst[:, None] * (TAPS * GROUPS) + o * GROUPS + (c // G)[None, :], mask=later,
                          other=0.0).to(tl.float32)
        dx += (b[None, :] + d_later) * dout_later
        # The products dout[t] * x[t - o] feed both ddelta (summed over a group) and dbase (summed over t).
        src = t - o
        xs = tl.load(x_row + src[:, None] * H + c[None, :], mask=here & (src >= 0)[:, None], other=0.0)
        prod = dout * xs.to(tl.float32)
        per_group = tl.sum(tl.reshape(prod, (BLOCK_L, GROUPS_HERE, G)), axis=2)
        tl.store(dd_row + t[:, None] * (TAPS * GROUPS) + o * GROUPS + g_here[None, :],
                 per_group.to(ddelta_ptr.dtype.element_ty), mask=t_ok[:, None] & (g_here < GROUPS)[None, :])
        tl.store(part + o * H + c, tl.sum(prod, axis=0), mask=c_ok)
    tl.store(dx_ptr + row * L * H + t[:, None] * H + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=here)


def _blocks(length: int, hidden: int, group_size: int) -> tuple[int, int]:
    # Blocks are short (DFlash blocks are 8-16 tokens): a whole block per program up to 16 positions, and
    # 64 channels (or one group, if larger) per program, so a 576-wide H is 9 programs per block with no waste.
    block_l = min(next_power_of_2(length), 16)
    block_h = max(group_size, min(64, next_power_of_2(hidden)))
    return block_l, block_h


class TritonGroupedDynamicConv(torch.autograd.Function):
    """x: (rows, L, H); delta: (rows, L, K, H // group_size); base: (K, H). Same maths as the reference."""

    @staticmethod
    def forward(ctx, x, delta, base, group_size: int):
        x, delta, base = x.contiguous(), delta.contiguous(), base.contiguous()
        rows, length, hidden = x.shape
        taps, groups = base.shape[0], hidden // group_size
        block_l, block_h = _blocks(length, hidden, group_size)
        grid = (rows, triton.cdiv(length, block_l), triton.cdiv(hidden, block_h))
        out = torch.empty_like(x)
        if x.numel():
            _conv_forward[grid](x, delta, base, out, length, hidden, groups, G=group_size, TAPS=taps,
                                BLOCK_L=block_l, BLOCK_H=block_h)
        ctx.save_for_backward(x, delta, base)
        ctx.group_size = group_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, delta, base = ctx.saved_tensors
        group_size = ctx.group_size
        rows, length, hidden = x.shape
        taps, groups = base.shape[0], hidden // group_size
        block_l, block_h = _blocks(length, hidden, group_size)
        grid = (rows, triton.cdiv(length, block_l), triton.cdiv(hidden, block_h))
        grad_out = grad_out.contiguous()
        dx, ddelta = torch.empty_like(x), torch.empty_like(delta)
        parts = torch.zeros(rows * grid[1], taps, hidden, dtype=torch.float32, device=x.device)
        if x.numel():
            _conv_backward[grid](x, delta, base, grad_out, dx, ddelta, parts, length, hidden, groups, G=group_size,
                                 TAPS=taps, BLOCK_L=block_l, BLOCK_H=block_h)
        return dx, ddelta, parts.sum(0).to(base.dtype), None


def supported(group_size: int) -> bool:
    """The backward kernel sums a group inside registers, which needs a power-of-two group size (16 in DFlash 2)."""
    return group_size > 0 and group_size & (group_size - 1) == 0


def triton_grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor,
                                group_size: int) -> torch.Tensor:
    """Same signature and shapes as kernels.dynamic_conv.grouped_dynamic_conv (validated by the caller)."""
    *lead, length, hidden = x.shape
    taps, groups = base.shape[0], hidden // group_size
    out = TritonGroupedDynamicConv.apply(x.reshape(-1, length, hidden), delta.reshape(-1, length, taps, groups),
                                         base, group_size)
    return out.reshape(*lead, length, hidden)
