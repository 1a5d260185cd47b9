"""Fixtures the trainer tests share, built once per test process."""

from __future__ import annotations

import pytest
from test_data import write_prompts
from tiny_targets import make_tiny_target

LEARNABLE_TAPS = (1, 2, 3)
"""The target layers the drafters trained on `learnable_data` tap."""


@pytest.fixture(scope="session")
def learnable_target(tmp_path_factory):
    """A tiny Qwen3 with peaked logits (init 0.25 rather than the default 0.02): a few steps move a drafter
    visibly, so a test can see it learn."""
    from trainer.targets import load_target

    return load_target(make_tiny_target(tmp_path_factory.mktemp("learnable"), "qwen3", init_std=0.25))


@pytest.fixture(scope="session")
def learnable_data(learnable_target, tmp_path_factory):
    """16 prompts answered by `learnable_target` (24 tokens each), with the hidden states of LEARNABLE_TAPS."""
    from schemas.sampling import SamplingParams
    from trainer.data.prompts import load_prompts
    from trainer.data.regenerate import regenerate

    root = tmp_path_factory.mktemp("learnable-data")
    prompts = load_prompts(write_prompts(root / "p.jsonl", n=16))
    return regenerate(learnable_target, prompts, SamplingParams(max_new_tokens=24), root / "data",
                      tap_layer_ids=list(LEARNABLE_TAPS))
