"""Random drafters for tests: every parameter perturbed, so no identity-initialised op hides a bug."""

from __future__ import annotations

import torch

from trainer.drafter import Drafter, DrafterConfig

EXPORTED_CONFIG = DrafterConfig(
    variant="dflash", hidden_size=64, intermediate_size=128, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256, vocab_size=512,
    num_target_layers=4, target_layer_ids=(1, 2), block_size=4, mask_token_id=5)
"""A small exported drafter's config, for the worker tests that hand publish what an export writes (no weights)."""


def random_drafter(target, variant: str = "dflash2", *, block_size: int = 8, num_layers: int = 2,
                   seed: int = 0, scale: float = 0.1, **overrides) -> Drafter:
    from trainer.targets.chat import choose_mask_token_id

    mask_token_id, _ = choose_mask_token_id(target.tokenizer, target.vocab_size)
    if variant == "dflash2":
        overrides.setdefault("selector_rank", 16)
        overrides.setdefault("selector_top_k", min(16, target.vocab_size // 2))
    config = DrafterConfig.for_target(target, variant=variant, num_layers=num_layers, block_size=block_size,
                                      mask_token_id=mask_token_id, **overrides)
    torch.manual_seed(seed)
    drafter = Drafter(config)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn_like(parameter) * scale)
    return drafter.to(target.dtype).eval()
