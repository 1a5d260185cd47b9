"""When the public ops in kernels/ take their Triton path.

Triton runs only on CUDA tensors here, and only when `triton` imports: a CPU caller never imports it, so
CPU results stay those of the plain-torch references, bit for bit. On a GPU the Triton path is opt-in,
`DRAFTSMITH_TRITON_KERNELS=1`, until bench/kernel_bench.py has run on one: these kernels are checked against
the references in Triton's interpreter only (2026-12-04: no GPU was lent), and a kernel that fails to compile
must not stop a customer's job. `0` (the default) keeps the torch path.
The tests run the Triton functions themselves on CPU tensors under `TRITON_INTERPRET=1`.
"""

from __future__ import annotations

import functools
import os

import torch

ENV = "DRAFTSMITH_TRITON_KERNELS"


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # not installed, or a broken install: the torch path is always there
        return False
    return True


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """True when every given tensor is on a CUDA device, triton imports and the switch is on."""
    present = [t for t in tensors if t is not None]
    if not present or not all(t.is_cuda for t in present):
        return False
    return os.environ.get(ENV, "0") == "1" and triton_importable()


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
