"""Replayed acceptance (drafter only, against the target's stored greedy output) against the real thing:
the speculative decoder with the target verifying every block. Float64 on both sides, so the stored taps
(one forward pass) and the decoder's incremental ones agree to the last bit that matters."""

from __future__ import annotations

import pytest
import torch
from drafters import random_drafter
from tiny_targets import make_tiny_target

from schemas.sampling import SamplingParams
from trainer.bootstrap import bootstrap_interval
from trainer.data.prompts import Prompt
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.validation.replay import (
    greedy_references,
    load_references,
    replay_acceptance,
    replay_greedy,
    save_references,
)

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=30)


@pytest.fixture(scope="module")
def small_vocab_target(tmp_path_factory):
    # A 24-token vocabulary: random drafts are accepted often enough to exercise long accepted prefixes.
    path = make_tiny_target(tmp_path_factory.mktemp("replay"), "qwen3", vocab_size=24, hidden_size=32,
                            num_layers=4, init_std=0.3, seed=5)
    return load_target(path, dtype=torch.float64)


def prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", ["a", "b"][i % 2], ({"role": "user", "content": " ".join(f"w{(i * 3 + j) % 12}"
                                                                                    for j in range(i + 1))},))
            for i in range(count)]


def repeat_the_anchor(drafter):
    """Random drafters are almost never accepted; this one drafts the anchor again at every position, which
    the tiny target's repetitive greedy output accepts often (candidates still come from its own logits, so
    they check the context the replay feeds it)."""
    def propose(hidden, logits, anchor_ids, temperature, generator=None, vocab_ids=None):
        candidates = logits.topk(drafter.config.selector_top_k, dim=-1).indices
        return anchor_ids[:, None].expand(-1, logits.shape[1]), candidates, None

    drafter.propose = propose
    return drafter


@pytest.mark.parametrize(("variant", "block_size"), [("dflash2", 4), ("dflash2", 8), ("dflash", 3)])
def test_replay_gives_the_decoders_cycles(small_vocab_target, variant, block_size, tmp_path):
    target = small_vocab_target
    drafter = random_drafter(target, variant, block_size=block_size, selector_top_k=6, scale=0.3,
                             target_layer_ids=[0, 2]).to(torch.float64)
    if variant == "dflash2":
        drafter = repeat_the_anchor(drafter)
    # References keep more layers than this drafter taps, in another order: the replay picks its columns.
    references = greedy_references(target, prompts(6), GREEDY, GREEDY.max_new_tokens, [2, 1, 0, 3])
    save_references(references, tmp_path / "refs")
    references = load_references(tmp_path / "refs")
    decoder = SpeculativeDecoder(target, drafter, record_candidates=True)
    accepted_somewhere = 0
    for reference in references:
        prompt = reference.tokens[:reference.prompt_len]
        real = decoder.generate(prompt, GREEDY)
        assert prompt + real.tokens == reference.tokens
        replayed = replay_greedy(target, drafter, reference)
        assert replayed == real.cycles
        accepted_somewhere += sum(c.accepted for c in replayed)
    assert accepted_somewhere > 5 or variant == "dflash"
    result = replay_acceptance(target, drafter, references)
    assert result.tau == pytest.approx(sum(e for e, _ in result.per_prompt) / sum(c for _, c in result.per_prompt))


def test_replay_stops_where_the_decoder_stops(small_vocab_target):
    target = small_vocab_target
    drafter = random_drafter(target, "dflash2", block_size=6, selector_top_k=6, scale=0.3).to(torch.float64)
    plain = SpeculativeDecoder(target).generate([7, 8, 9], GREEDY, stop_token_ids=[])
    stop = plain.tokens[7]
    reference = greedy_references(target, prompts(1), GREEDY, GREEDY.max_new_tokens,
                                  list(drafter.config.target_layer_ids))[0]
    prompt = reference.tokens[:reference.prompt_len]
    real = SpeculativeDecoder(target, drafter).generate(prompt, GREEDY, stop_token_ids=[stop])
    replayed = replay_greedy(target, drafter, reference, stop_token_ids=[stop])
    assert [c.emitted for c in replayed] == [c.emitted for c in real.cycles]


def test_bootstrap_interval_covers_the_estimate_and_narrows_with_prompts():
    few = [(3, 2), (5, 4), (2, 2), (9, 5)]
    low, high = bootstrap_interval(few)
    tau = sum(e for e, _ in few) / sum(c for _, c in few)
    assert low <= tau <= high
    many = few * 25
    low_many, high_many = bootstrap_interval(many)
    assert high_many - low_many < high - low
    # Paired against itself the difference is exactly zero.
    assert bootstrap_interval(many, baseline=many) == (0.0, 0.0)
