"""Grouped dynamic depthwise convolution of DFlash 2 (plain-torch reference).

For every block (one row of `x`), channel c in group g = c // group_size, and tap o:

    out[t, c] = sum_o (base[o, c] + delta[t, o, g]) * x[t - o, c]        (x[t - o] = 0 when t < o)

Taps look only backwards and never leave the row, so a caller that lays several blocks side by side
reshapes them to one row per block first: a tap never crosses a block boundary.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kernels._triton import use_triton


def grouped_dynamic_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, group_size: int
) -> torch.Tensor:
    """x: (..., L, H) one block per row; delta: (..., L, K, H // group_size); base: (K, H)."""
    *lead, length, hidden = x.shape
    taps, groups = base.shape[0], hidden // group_size
    if hidden % group_size:
        raise ValueError(f"hidden size {hidden} is not a multiple of conv_group_size {group_size}")
    if delta.shape[-2:] != (taps, groups):
        raise ValueError(f"delta has shape {tuple(delta.shape)}, expected (..., {length}, {taps}, {groups})")
    if use_triton(x, delta, base):  # CUDA tensors: the Triton kernel (kernels/triton_dynamic_conv.py)
        from kernels.triton_dynamic_conv import supported, triton_grouped_dynamic_conv

        if supported(group_size):
            return triton_grouped_dynamic_conv(x, delta, base, group_size)
    x = x.reshape(-1, length, groups, group_size)
    delta = delta.reshape(-1, length, taps, groups, 1).to(x.dtype)
    base = base.view(taps, 1, 1, groups, group_size).to(x.dtype)
    out = torch.zeros_like(x)
    for offset in range(taps):
        if offset >= length:  # the tap reads only the zero padding (and slicing past the start would misshape it)
            break
        # Shift the row right by `offset` along the sequence, zero-filling the start of the block.
        shifted = x if offset == 0 else F.pad(x[:, :-offset], (0, 0, 0, 0, offset, 0))
        out = out + base[offset] * shifted
        out = torch.addcmul(out, delta[:, :, offset], shifted)
    return out.reshape(*lead, length, hidden)
