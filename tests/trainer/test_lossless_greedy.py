"""Greedy speculative decoding must reproduce the target's own greedy output token for token, whatever
the drafter: an untrained (random) drafter is the harshest case, since almost every draft is rejected."""

from __future__ import annotations

import pytest
import torch
from drafters import random_drafter
from tiny_targets import make_tiny_target

from schemas.sampling import SamplingParams
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.targets.chat import render_prompt

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2", "mistral"])
def tiny_target(request, tmp_path_factory):
    tie = request.param == "llama"  # cover tied and untied embeddings
    return load_target(make_tiny_target(tmp_path_factory.mktemp(request.param), request.param, tie=tie))


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
@pytest.mark.parametrize("block_size", [2, 8, 16])
def test_tiny_targets_greedy_lossless(tiny_target, variant, block_size):
    drafter = random_drafter(tiny_target, variant, block_size=block_size, seed=block_size)
    speculative, plain = SpeculativeDecoder(tiny_target, drafter), SpeculativeDecoder(tiny_target)
    generator = torch.Generator().manual_seed(block_size)
    for _ in range(3):
        prompt = torch.randint(5, tiny_target.vocab_size, (int(torch.randint(1, 20, (1,), generator=generator)),),
                               generator=generator).tolist()
        expected = plain.generate(prompt, GREEDY, stop_token_ids=[])
        got = speculative.generate(prompt, GREEDY, stop_token_ids=[])
        assert got.tokens == expected.tokens
        assert len(got.tokens) == GREEDY.max_new_tokens
        assert sum(got.acceptance_lengths) == len(got.tokens) - 1  # the prefill emits the first token


def test_stop_token_and_max_tokens_inside_a_cycle(tiny_qwen3):
    """A stop token or the token budget can end a response in the middle of a verified block."""
    drafter = random_drafter(tiny_qwen3, "dflash2", block_size=8)
    plain = SpeculativeDecoder(tiny_qwen3).generate([7, 8, 9], GREEDY, stop_token_ids=[])
    stop_token = plain.tokens[5]
    expected = plain.tokens[:plain.tokens.index(stop_token) + 1]
    got = SpeculativeDecoder(tiny_qwen3, drafter).generate([7, 8, 9], GREEDY, stop_token_ids=[stop_token])
    assert got.tokens == expected
    assert got.stop_reason == "stop"
    for max_new in (1, 2, 9):
        short = SpeculativeDecoder(tiny_qwen3, drafter).generate([7, 8, 9], GREEDY, max_new_tokens=max_new,
                                                                 stop_token_ids=[])
        assert short.tokens == plain.tokens[:max_new]



def test_decodes_from_one_kept_prefill_equal_fresh_ones(tiny_qwen3):
    """The sampling test starts many decodes from one prompt pass: each must equal a decode that ran the
    prompt itself, and none may change what the next one starts from."""
    drafter = random_drafter(tiny_qwen3, "dflash2", block_size=8)
    decoder = SpeculativeDecoder(tiny_qwen3, drafter)
    fresh = decoder.generate([7, 8, 9], GREEDY, stop_token_ids=[])
    kept = decoder.prefill([7, 8, 9])
    for _ in range(2):
        again = decoder.generate([7, 8, 9], GREEDY, stop_token_ids=[], prefill=kept)
        assert again.tokens == fresh.tokens and again.acceptance_lengths == fresh.acceptance_lengths
    with pytest.raises(ValueError, match="another prompt"):
        decoder.generate([7, 8], GREEDY, prefill=kept)

@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
@pytest.mark.parametrize("block_size", [2, 8, 16])
def test_smollm2_greedy_lossless(smollm2, variant, block_size):
    prompt = render_prompt(smollm2.tokenizer, [{"role": "user", "content": "Name three prime numbers."}])
    params = SamplingParams(max_new_tokens=24)
    expected = SpeculativeDecoder(smollm2).generate(prompt, params)
    drafter = random_drafter(smollm2, variant, block_size=block_size, num_layers=1, scale=0.02)
    got = SpeculativeDecoder(smollm2, drafter).generate(prompt, params)
    assert got.tokens == expected.tokens
    assert got.stop_reason == expected.stop_reason
