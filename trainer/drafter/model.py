"""The DFlash / DFlash 2 drafter, in plain single-device PyTorch.

A drafter denoises one block `[anchor, MASK x (B-1)]` per speculative cycle. Queries come only from the
block; keys/values are the block's plus the target's context features (taps concatenated, projected by
`fc`, normalised by `hidden_norm`) of every position before the anchor. Attention is bidirectional
inside the block. DFlash 2 wraps both sublayers of every layer in a grouped dynamic convolution and
picks the drafts with a candidate selector (kernels/).

One forward serves both uses:
- decoding: one block, context features of the newly accepted tokens, and a `DrafterCache` holding the
  keys/values of all earlier context (the block's own keys/values are never cached);
- training: many blocks side by side over a whole sequence of context, with a mask saying which context each
  block may see (`trainer/training/blocks.py` builds it), run on a fused kernel (`trainer/drafter/attention.py`).
Parameter names equal the reference `dflash` package's, so state dicts load either way.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from kernels import edge_scores, grouped_dynamic_conv, selector_top_probability, selector_walk
from trainer.drafter.attention import attention_bias, attention_dtype, masked_attention
from trainer.drafter.config import DrafterConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables (batch, len, head_dim) for absolute positions, computed in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, len, head_dim); cos/sin: (batch, len, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DrafterCache:
    """Keys/values of the context seen so far, per layer (already normed and rotated)."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.rope_theta = c.rope_theta
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim)

    def forward(self, x, context, rope_block, rope_context, mask, cache: DrafterCache | None, layer: int):
        q = apply_rotary(self.q_norm(self._split(self.q_proj(x), self.heads)).transpose(1, 2), *rope_block)
        # The context's keys/values go through this layer's own k/v projections (and k_norm, RoPE).
        k_ctx = apply_rotary(self.k_norm(self._split(self.k_proj(context), self.kv_heads)).transpose(1, 2), *rope_context)
        v_ctx = self._split(self.v_proj(context), self.kv_heads).transpose(1, 2)
        if cache is not None:
            k_ctx, v_ctx = cache.extend(layer, k_ctx, v_ctx)
        k_blk = apply_rotary(self.k_norm(self._split(self.k_proj(x), self.kv_heads)).transpose(1, 2), *rope_block)
        v_blk = self._split(self.v_proj(x), self.kv_heads).transpose(1, 2)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        if mask is None:  # decoding: no mask, which flash attention runs with grouped-query heads as they are
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.heads != self.kv_heads)
        else:
            out = masked_attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DynamicConv(nn.Module):
    """DFlash 2: the convolution pair around one sublayer. Both corrections come from the sublayer's
    normed input: the first call filters that input and returns the second correction, the second call
    (given it) filters the sublayer's output. One `forward` for both, so ZeRO-3's per-module parameter
    gathering sees every use."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.taps, self.group_size = c.conv_kernel_size, c.conv_group_size
        self.groups = c.hidden_size // c.conv_group_size
        self.base_kernel = nn.Parameter(torch.empty(2, self.taps, c.hidden_size))
        self.kernel_projection = nn.Linear(c.hidden_size, 2 * self.taps * self.groups, bias=False)

    def forward(self, x: torch.Tensor, block_len: int, delta: torch.Tensor | None = None):
        if delta is None:
            both = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
            return self._conv(x, both[..., 0, :, :], 0, block_len), both[..., 1, :, :]
        return self._conv(x, delta, 1, block_len)

    def _conv(self, x, delta, which, block_len):
        # One row per block, so taps never cross a block boundary.
        batch, length, hidden = x.shape
        rows = x.reshape(batch * (length // block_len), block_len, hidden)
        delta = delta.reshape(rows.shape[0], block_len, self.taps, self.groups)
        return grouped_dynamic_conv(rows, delta, self.base_kernel[which], self.group_size).view(batch, length, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        self.attention_conv = DynamicConv(c) if c.variant == "dflash2" else None
        self.mlp_conv = DynamicConv(c) if c.variant == "dflash2" else None

    def forward(self, x, context, rope_block, rope_context, mask, cache, layer, block_len):
        h = self.input_layernorm(x)
        if self.attention_conv is not None:
            h, delta = self.attention_conv(h, block_len)
        h = self.self_attn(h, context, rope_block, rope_context, mask, cache, layer)
        if self.attention_conv is not None:
            h = self.attention_conv(h, block_len, delta)
        x = x + h
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, delta = self.mlp_conv(h, block_len)
        h = self.mlp(h)
        if self.mlp_conv is not None:
            h = self.mlp_conv(h, block_len, delta)
        return x + h


class CandidateSelector(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.top_k = c.selector_top_k
        self.predecessor_codebook = nn.Embedding(c.vocab_size, c.selector_rank)
        self.successor_codebook = nn.Embedding(c.vocab_size, c.selector_rank)
        self.hidden_projection = nn.Linear(c.hidden_size, c.selector_rank, bias=False)

    def forward(self, hidden: torch.Tensor, unary: torch.Tensor, candidates: torch.Tensor,
                predecessors: torch.Tensor) -> torch.Tensor:
        """Edge scores (..., K) of the candidates after the given predecessor tokens (training path)."""
        return edge_scores(unary, candidates, self.hidden_projection(hidden), predecessors,
                           self.predecessor_codebook.weight, self.successor_codebook.weight)


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        c = config
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.candidate_selector = CandidateSelector(c) if c.variant == "dflash2" else None
        self.draft_vocab: torch.Tensor | None = None
        """Sorted token ids the drafter drafts among (trainer/drafter/draft_vocab.py); None: the full vocabulary."""
        self.context_noise = 0.0
        """Training only: std of Gaussian noise on the normed context features (a regulariser; the trainer sets it)."""
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Linear layers N(0, std), norms 1, convolutions' base kernels the identity, selector codebooks such that
        the walk starts as argmax. The convolutions' correction projections end up N(0, std) too (the module walk
        reaches each after its convolution zeroed it), so an untrained DFlash 2 layer is near, not exactly, a
        DFlash layer; an upgrade from a DFlash parent zeroes them (trainer/drafter/upgrade.py)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, DynamicConv):
                module.base_kernel.zero_()
                module.base_kernel[:, 0] = 1.0
                nn.init.zeros_(module.kernel_projection.weight)
        if self.candidate_selector is not None:
            rank = self.config.selector_rank
            nn.init.normal_(self.candidate_selector.predecessor_codebook.weight, std=1.0)
            nn.init.zeros_(self.candidate_selector.successor_codebook.weight)
            nn.init.normal_(self.candidate_selector.hidden_projection.weight, std=rank ** -0.5)

    def forward(self, noise: torch.Tensor, positions: torch.Tensor, context: torch.Tensor,
                context_positions: torch.Tensor, mask: torch.Tensor | None = None,
                cache: DrafterCache | None = None, block_len: int | None = None) -> torch.Tensor:
        """Final hidden states (normed) of the block tokens.

        noise: (batch, Q, H) embeddings of the blocks; positions: (batch, Q) absolute positions;
        context: (batch, S, taps*H) raw target taps; context_positions: (batch, S);
        mask: None (everything visible), boolean (batch or 1, 1, Q, S_cached + S + Q; True: visible) or that
        mask as an additive float bias (`trainer/drafter/attention.py`: attention_bias);
        block_len: length of one block (Q is a whole number of blocks); defaults to Q.
        """
        block_len = block_len or noise.shape[1]
        context = self.hidden_norm(self.fc(context))
        if self.training and self.context_noise:
            context = context + torch.randn_like(context) * self.context_noise
        rope_block = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, noise.dtype)
        rope_context = rotary_cos_sin(context_positions, self.config.head_dim, self.config.rope_theta, noise.dtype)
        if mask is not None and mask.dtype == torch.bool:  # one bias shared by every layer
            mask = attention_bias(mask, attention_dtype(noise))
        x = noise
        for index, layer in enumerate(self.layers):
            x = layer(x, context, rope_block, rope_context, mask, cache, index, block_len)
        return self.norm(x)

    def embed_block(self, block_ids: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The block's input: the target's (frozen) embeddings of [anchor, MASK...], times the configured scale."""
        noise = F.embedding(block_ids, embedding)
        scale = self.config.input_embedding_scale
        return noise if scale is None else noise * scale

    def propose(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float,
                generator: torch.Generator | None = None, vocab_ids: torch.Tensor | None = None):
        """DFlash 2 drafts: (tokens (b, L), candidates (b, L, K), proposal q over candidates or None).
        vocab_ids: the token of each logit column when the logits cover a draft vocabulary only."""
        selector = self.candidate_selector
        return selector_walk(
            logits, selector.hidden_projection(hidden), anchor_ids, selector.predecessor_codebook.weight,
            selector.successor_codebook.weight, selector.top_k, temperature, generator, vocab_ids,
        )

    def confidence(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, path: torch.Tensor,
                   vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The per-position score a confidence map calibrates (trainer/validation/confidence.py), (b, L): DFlash 2,
        the selector's top-1 probability after the walked predecessor; DFlash, the top-1 probability of the drafter's
        own distribution (at T = 0 both are the draft's probability). Top-1, not the drawn token's: a score that
        never reads the token drawn at its position keeps a verify length chosen from it exact under sampling."""
        selector = self.candidate_selector
        if selector is None:
            return torch.softmax(logits.float(), dim=-1).amax(dim=-1)
        return selector_top_probability(
            logits, selector.hidden_projection(hidden), anchor_ids, path, selector.predecessor_codebook.weight,
            selector.successor_codebook.weight, selector.top_k, vocab_ids,
        )
