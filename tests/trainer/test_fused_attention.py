"""Training attention on a fused kernel: the same outputs as the plain masked grouped-query call on the CPU, and
at the gpu preset's shapes a call CUDA's memory-efficient kernel takes as it is (checked on meta tensors: no GPU)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from trainer.drafter import attention as attention_module
from trainer.drafter.attention import BIAS_ALIGNMENT, attention_bias, efficient_kernel_blockers, masked_attention
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.training.blocks import block_attention_bias, build_blocks


def small_config(**changes) -> DrafterConfig:
    base = dict(variant="dflash2", hidden_size=64, intermediate_size=96, num_layers=2, num_attention_heads=6,
                num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                max_position_embeddings=4096, vocab_size=300, num_target_layers=4, target_layer_ids=(1, 2),
                block_size=4, mask_token_id=7, selector_rank=8, selector_top_k=8)
    return DrafterConfig(**{**base, **changes})


def plain_masked_gqa(q, k, v, bias):
    """The call training made before: a boolean mask and grouped-query heads (CUDA: the math kernel)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias == 0, enable_gqa=q.shape[1] != k.shape[1])


def test_masked_attention_equals_the_plain_grouped_query_call():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 8, 16), torch.randn(2, 2, 13, 16), torch.randn(2, 2, 13, 16)
    mask = torch.rand(2, 1, 8, 13) < 0.4
    mask[..., 3] = True  # every query sees something
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    bias = attention_bias(mask, torch.float32)
    torch.testing.assert_close(masked_attention(q, k, v, bias), expected, rtol=1e-6, atol=1e-6)
    # The bias's rows start on aligned boundaries although 13 keys are not a multiple of anything.
    assert bias.stride()[:-1] == (8 * BIAS_ALIGNMENT, 8 * BIAS_ALIGNMENT, BIAS_ALIGNMENT) and bias.stride(-1) == 1


def test_the_bias_is_the_inference_layout():
    """Built from the anchors where they are, it says what the boolean mask of before said."""
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 0], [20, 21, 22, 23, 0, 0, 0, 0]])
    lengths, prompt_lens = torch.tensor([7, 4]), torch.tensor([2, 1])
    batch = build_blocks(ids, lengths, prompt_lens, torch.zeros(2, 8, 3), block_size=3, num_anchors=10,
                         mask_token_id=99, decay_gamma=4.0, generator=torch.Generator().manual_seed(1))
    anchors, valid = batch.anchors, batch.anchor_valid
    blocks, width = anchors.shape[1], ids.shape[1]
    query_block = torch.arange(blocks).repeat_interleave(3)
    sees_context = (torch.arange(width)[None, None] < anchors[:, query_block, None]) & valid[:, query_block, None]
    sees_block = (query_block[:, None] == query_block[None, :]).expand(2, -1, -1)
    before = torch.cat([sees_context, sees_block], dim=2)[:, None]
    assert not bool(valid.all())  # the short row has padding blocks, which must see no context
    bias = block_attention_bias(anchors, valid, width, 3, torch.bfloat16)
    assert bias.dtype == torch.bfloat16 and torch.equal(bias == 0, before)
    assert bool(torch.isneginf(bias[~before]).all())
    assert torch.equal(batch.mask, before)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_drafter_training_forward_is_unchanged(variant):
    """The whole training forward (every layer, shared bias) against the plain call, float32 on the CPU, forward
    and backward."""
    torch.manual_seed(0)
    config = small_config(variant=variant)
    drafter = Drafter(config)
    ids = torch.randint(10, 300, (2, 12))
    context = torch.randn(2, 12, 2 * 64)
    batch = build_blocks(ids, torch.tensor([12, 9]), torch.tensor([3, 2]), context, block_size=4, num_anchors=5,
                         mask_token_id=7, decay_gamma=4.0, generator=torch.Generator().manual_seed(2))
    noise = drafter.embed_block(batch.block_ids, torch.randn(300, 64))
    positions = torch.arange(12).expand(2, -1)

    def run(patch):
        drafter.zero_grad()
        with pytest.MonkeyPatch.context() as mp:
            if patch:
                mp.setattr("trainer.drafter.model.masked_attention", plain_masked_gqa)
            out = drafter(noise, batch.block_positions, context, positions, mask=batch.mask, block_len=4)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in drafter.parameters() if p.grad is not None]

    fused, fused_grads = run(patch=False)
    plain, plain_grads = run(patch=True)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# The gpu preset (schemas/recipe.py): 5 layers, block 16, 512 anchors, batch 8; SmolLM2-135M's attention shape
# and a Llama-3.1-8B-shaped one; ~600 context positions (a prompt and a 512-token answer).
GPU_SHAPES = {"smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, vocab_size=49152),
              "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=128256)}


@pytest.mark.parametrize("shape", sorted(GPU_SHAPES))
def test_gpu_preset_training_attention_is_a_fused_kernel_call(shape, monkeypatch):
    """Every layer's SDPA call at the gpu preset's shapes, in bfloat16 on meta tensors (no memory, no GPU), meets
    every condition of CUDA's memory-efficient kernel, and the mask goes in without a per-layer copy; the call made
    before would not have (so the check can fail)."""
    config = small_config(num_layers=5, block_size=16, target_layer_ids=(1, 2, 3), num_target_layers=30,
                          **GPU_SHAPES[shape])
    batch, anchors, width = 8, 512, 600
    with torch.device("meta"):
        drafter = Drafter(config).to(torch.bfloat16)
        anchor_ids = torch.zeros(batch, anchors, dtype=torch.long)
        bias = block_attention_bias(anchor_ids, torch.ones(batch, anchors, dtype=torch.bool), width, 16,
                                    torch.bfloat16)
        noise = torch.empty(batch, anchors * 16, config.hidden_size, dtype=torch.bfloat16)
        positions = torch.zeros(batch, anchors * 16, dtype=torch.long)
        context = torch.empty(batch, width, 3 * config.hidden_size, dtype=torch.bfloat16)
        context_positions = torch.zeros(batch, width, dtype=torch.long)
    calls = []

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((q, k, v, attn_mask, kwargs))
        return torch.empty_like(q)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    drafter(noise, positions, context, context_positions, mask=bias, block_len=16)
    assert len(calls) == config.num_layers
    for q, k, v, mask, kwargs in calls:
        assert q.device.type == "meta" and q.dtype == torch.bfloat16
        assert mask is bias  # one bias for every layer, not a copy each
        assert efficient_kernel_blockers(q, k, v, mask, **kwargs) == []
    q, k, v, mask, _ = calls[0]
    groups = config.num_attention_heads // config.num_key_value_heads
    before = efficient_kernel_blockers(q, k[:, ::groups], v[:, ::groups], torch.empty(mask.shape, dtype=torch.bool,
                                       device="meta"), enable_gqa=True)
    assert any("math kernel" in reason for reason in before)
    # What the fused call spares: the math kernel's float32 scores, per layer, against the one bias.
    scores = batch * config.num_attention_heads * q.shape[2] * k.shape[2] * 4
    assert scores > 10 * bias.numel() * bias.element_size()
