"""Hot drafter ops. Each op has a plain-torch reference here and a Triton kernel behind the same signature
(kernels/triton_*.py), taken for CUDA tensors when triton imports (kernels/_triton.py); CPU tensors always take
the reference. tests/kernels/test_triton_kernels.py checks each kernel against its reference in Triton's
interpreter; bench/kernel_bench.py times them."""

from kernels.dynamic_conv import grouped_dynamic_conv
from kernels.selector import edge_scores, selector_top_probability, selector_walk

__all__ = ["edge_scores", "grouped_dynamic_conv", "selector_top_probability", "selector_walk"]
