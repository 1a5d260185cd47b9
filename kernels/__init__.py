"""Hot drafter ops. Each op has a plain-torch reference here; a Triton kernel may replace it later,
behind the same signature, and is tested against the reference."""

from kernels.dynamic_conv import grouped_dynamic_conv
from kernels.selector import edge_scores, selector_walk

__all__ = ["edge_scores", "grouped_dynamic_conv", "selector_walk"]
