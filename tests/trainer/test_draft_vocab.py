"""Drafting over a draft vocabulary: cheaper drafts, the same output. Greedy output equals the target's,
sampled output follows the target's distribution, a draft vocabulary that is the whole vocabulary drafts
exactly what the full head drafts, and the d2t / t2d tables round-trip."""

from __future__ import annotations

import pytest
import torch
from drafters import random_drafter
from test_lossless_sampling import CASES, goodness_of_fit, peaked_target  # noqa: F401 (fixture)

from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import load_drafter, save_drafter
from trainer.drafter.draft_vocab import coverage, frequency_ranked_vocab, load_draft_vocab, save_draft_vocab
from trainer.errors import DrafterError
from trainer.speculative import SpeculativeDecoder

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=30)


def test_frequency_ranking_keeps_the_most_frequent_and_the_required_tokens():
    responses = [[5, 5, 5, 7, 7, 9, 2], [5, 7, 11]]
    ids = frequency_ranked_vocab(responses, vocab_size=20, size=3, always=[2])
    assert ids.tolist() == [2, 5, 7]
    assert coverage(responses, ids) == pytest.approx(8 / 10)
    padded = frequency_ranked_vocab(responses, vocab_size=20, size=8)
    assert len(padded) == 8 and {5, 7, 9, 11, 2} <= set(padded.tolist())


def test_d2t_round_trip_and_loading_with_the_drafter(tiny_qwen3, tmp_path):
    drafter = random_drafter(tiny_qwen3, "dflash2")
    save_drafter(drafter, tmp_path)
    assert load_drafter(tmp_path).draft_vocab is None
    ids = torch.tensor([3, 9, 10, 40, 200])
    save_draft_vocab(ids, tiny_qwen3.vocab_size, tmp_path)
    assert torch.equal(load_draft_vocab(tmp_path), ids)
    with pytest.raises(DrafterError, match="draft_vocab_size None"):  # config.json must name it
        load_drafter(tmp_path)
    drafter.config = drafter.config.replace(draft_vocab_size=5)
    save_drafter(drafter, tmp_path)
    assert torch.equal(load_drafter(tmp_path).draft_vocab, ids)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_whole_vocabulary_as_draft_vocabulary_drafts_the_same(tiny_qwen3, variant):
    drafter = random_drafter(tiny_qwen3, variant)
    full = SpeculativeDecoder(tiny_qwen3, drafter, record_candidates=True).generate([7, 8, 9], GREEDY)
    drafter.draft_vocab = torch.arange(tiny_qwen3.vocab_size)
    subset = SpeculativeDecoder(tiny_qwen3, drafter, record_candidates=True).generate([7, 8, 9], GREEDY)
    assert subset.tokens == full.tokens and subset.cycles == full.cycles


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_greedy_output_unchanged_with_a_small_draft_vocabulary(tiny_qwen3, variant):
    drafter = random_drafter(tiny_qwen3, variant)
    plain = SpeculativeDecoder(tiny_qwen3).generate([7, 8, 9], GREEDY, stop_token_ids=[])
    drafter.draft_vocab = torch.tensor(sorted(set(plain.tokens[::2]) | {5, 6, 100, 101, 102, 103, 104, 105,
                                                                         106, 107, 108, 109, 110, 111, 112, 113}))
    result = SpeculativeDecoder(tiny_qwen3, drafter, record_candidates=True).generate([7, 8, 9], GREEDY,
                                                                                      stop_token_ids=[])
    assert result.tokens == plain.tokens
    drafted = {token for cycle in result.cycles for row in cycle.candidates for token in row}
    assert drafted <= set(drafter.draft_vocab.tolist())


@pytest.mark.parametrize(("variant", "params"), [CASES[0], CASES[3]], ids=["dflash2-T1", "dflash-T0.7-topp-topk"])
def test_sampling_still_follows_the_target_with_a_draft_vocabulary(peaked_target, variant, params):  # noqa: F811
    drafter = random_drafter(peaked_target, variant, block_size=3, selector_top_k=4, selector_rank=8, scale=0.5)
    drafter.draft_vocab = torch.tensor([2, 3, 5, 8, 9, 11, 12, 14])
    assert goodness_of_fit(peaked_target, drafter, params) > 1e-3
