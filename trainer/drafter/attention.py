"""Masked attention that a fused SDPA kernel runs (training's many-blocks forward).

Training attends with an explicit mask (each block sees the context before its anchor and its own block). Handed to
`F.scaled_dot_product_attention` with grouped-query heads (`enable_gqa`) and a boolean mask, CUDA's SDPA falls back
to its float32 math kernel, which materialises every score: batch x heads x queries x keys x 4 bytes per layer
(~20.7 GB a layer at the gpu preset for SmolLM2-135M). Flash attention takes no mask at all, so the path here is
the memory-efficient kernel, which takes an additive bias:

- K/V are expanded to the query heads (`repeat_interleave`, the same head mapping `enable_gqa` uses), so the call
  does not depend on a kernel's grouped-query support;
- the mask becomes an additive bias (0 visible, -inf hidden) in the dtype the attention runs in, once per drafter
  forward and shared by every layer: given a boolean mask, SDPA would convert it in every layer and the efficient
  kernel's backward would keep each layer's copy;
- the bias's rows are padded in memory to a multiple of BIAS_ALIGNMENT elements, its last dimension contiguous: the
  efficient kernel copies (pads) any bias whose strides are not multiples of 8 elements, every layer.

flex_attention with a block mask would also skip the fully masked tiles, but it is fast only compiled (Triton),
which neither this CPU machine nor a plain eager GPU run can check; the efficient kernel runs eagerly, and its
bias costs batch x queries x keys x 2 bytes once a step (1.2 GB at the gpu preset), not per layer and head.

`efficient_kernel_blockers` lists what would keep CUDA's memory-efficient kernel from running a call, after
PyTorch's selection rules (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, `can_use_mem_efficient_attention`,
and attention.cpp's `preprocess_mask`): tests check the training call on meta tensors at the gpu preset's shapes,
where no CUDA is present to ask.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

BIAS_ALIGNMENT = 16
"""Elements: the efficient kernel needs bias strides that are multiples of 8 (16 covers every dtype's 16 bytes)."""


def attention_dtype(reference: torch.Tensor) -> torch.dtype:
    """The dtype SDPA will see: autocast's when it is on (it casts a float bias too, a copy per layer), else the
    activations'."""
    device = reference.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return reference.dtype


def empty_bias(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised bias of `shape` whose rows start on BIAS_ALIGNMENT-element boundaries (a view of a padded
    buffer; the padding is never read)."""
    *lead, keys = shape
    padded = -(-keys // BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    return torch.empty((*lead, padded), dtype=dtype, device=device)[..., :keys]


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive bias of a boolean mask (True: may attend): 0 there, -inf elsewhere, aligned (module docstring)."""
    bias = empty_bias(tuple(mask.shape), dtype, mask.device).fill_(float("-inf"))
    return bias.masked_fill_(mask, 0.0)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SDPA of q (b, heads, Q, d) over k/v (b, kv_heads, K, d) with an additive `bias` (b|1, 1, Q, K)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def efficient_kernel_blockers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                              *, enable_gqa: bool = False, sm_major: int = 9) -> list[str]:
    """Why CUDA's memory-efficient SDPA kernel would not run this call as is (empty: it runs it, without copying
    the mask). `sm_major`: the GPU generation (9: H100/H200). PyTorch releases up to the GPU image's (2.11) send
    grouped-query calls with a mask to the math kernel, so `enable_gqa` with fewer K/V heads is a blocker."""
    blockers = []
    if not (q.dim() == k.dim() == v.dim() == 4):
        return ["q, k and v must be 4-D (batch, heads, length, head_dim)"]
    half = q.dtype in (torch.float16, torch.bfloat16)
    allowed = (torch.float16, torch.float32, torch.bfloat16) if sm_major >= 8 else (torch.float16, torch.float32)
    if q.dtype not in allowed or k.dtype != q.dtype or v.dtype != q.dtype:
        blockers.append(f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: the kernel takes one of {allowed} for all three")
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        blockers.append(f"{q.shape[1]} query heads over {k.shape[1]} key/value heads: grouped-query attention "
                        "with a mask goes to the math kernel; expand K/V to the query heads")
    if enable_gqa and q.shape[1] != k.shape[1]:
        blockers.append("enable_gqa with a mask: the math kernel")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0] or k.shape[2] != v.shape[2]:
        blockers.append("batch sizes or key/value lengths differ")
    # minimum_gemm_alignment on sm80+: 128 bits per tensor-core operand.
    alignment = 8 if half else 4
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % alignment or v.shape[-1] % alignment:
        blockers.append(f"head dims {q.shape[-1]}/{k.shape[-1]}/{v.shape[-1]}: equal q/k, multiples of {alignment}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        blockers.append("q, k and v need a contiguous last dimension")
    if any(t.storage_offset() % alignment for t in (q, k, v)):
        blockers.append(f"q, k and v storage offsets must be multiples of {alignment} elements")
    if attn_mask is not None:
        blockers += _bias_blockers(q, k, attn_mask)
    return blockers


def _bias_blockers(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> list[str]:
    blockers = []
    if mask.dtype not in (torch.bool, q.dtype):
        blockers.append(f"mask dtype {mask.dtype}: boolean or the query's ({q.dtype})")
    elif mask.dtype == torch.bool:
        blockers.append("a boolean mask is converted to a float copy in every layer, and each copy is kept for "
                        "the backward; pass one additive bias (attention_bias)")
    if mask.requires_grad:
        blockers.append("the mask requires grad")
    if mask.stride(-1) != 1:
        blockers.append("the mask's last dimension must be contiguous")
    try:
        torch.broadcast_shapes(mask.shape, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    except RuntimeError:
        blockers.append(f"mask shape {tuple(mask.shape)} does not broadcast to the scores'")
    if any(stride % 8 for stride in mask.stride()[:-1]) or mask.storage_offset() % 8:
        blockers.append(f"mask strides {mask.stride()}: the kernel pads (copies) a mask whose strides are not "
                        "multiples of 8, in every layer")
    return blockers
