"""The per-job sampling check has power: on the real SmolLM2 target, with the validation defaults (the first
validation prompts, SAMPLING_DRAWS draws, T=1 for a greedy job), it rejects a speculative decoder whose
residual after a rejection is p instead of norm(max(p - q, 0)).

That the correct decoder passes is shown elsewhere, with more power per second: a correct decoder fails this
check with probability alpha by the test's construction, tests/trainer/test_lossless_sampling.py tests the
decoder's exactness with 1,000 draws a case on a target whose whole distribution is enumerable, and every job's
validation (the main job's included) runs this check on its own drafter; bench/sampling_power.py prints both
p-values on SmolLM2 with a trained drafter. One run of the default check here takes minutes of the suite.

How much a wrong residual shows depends on how much the proposal overlaps the target (with no overlap
nothing is ever accepted and any residual is p): the stand-in drafter here proposes the target's own most
likely token (q one-hot), as a well-trained drafter nearly does; bench/sampling_power.py measures the
check's power with a real trained drafter. Rejection sampling, verification and the residual are the
decoder's own; only the drafting is replaced."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

import trainer.sampling
from schemas import recipe
from schemas.sampling import SamplingParams
from trainer.data.prompts import load_prompts, split_prompts
from trainer.sampling import target_probs
from trainer.speculative import SpeculativeDecoder
from trainer.targets.chat import render_prompt
from trainer.validation.report import SAMPLING_ALPHA
from trainer.validation.sampling_test import sampling_lossless_test


class GreedyTargetDrafter(SpeculativeDecoder):
    """Drafts the target's most likely next tokens, with proposal q = one-hot on them. It follows the tokens
    committed so far (prefill token, then each verify's accepted drafts and bonus) to know the prefix."""

    def __init__(self, target, block_size: int):
        super().__init__(target)
        # The base refuses a block > 1 without a drafter; _draft replaces it, and only its taps' shape is read.
        self.block_size = block_size
        self.drafter = SimpleNamespace(config=SimpleNamespace(target_layer_ids=(0,), num_layers=1))
        self.best: dict[tuple[int, ...], int] = {}

    def generate(self, prompt_ids, params, *, prefill=None, **kwargs):
        self.history = list(prompt_ids)
        self.prompt = prefill or self.prefill(prompt_ids)
        return super().generate(prompt_ids, params, prefill=prefill, **kwargs)

    def _choose(self, logits, params, generator):
        token = super()._choose(logits, params, generator)
        self.history.append(token)
        return token

    def _verify(self, block, logits, proposal, params, generator):
        accepted, bonus = super()._verify(block, logits, proposal, params, generator)
        self.history += block[1:1 + accepted] + [bonus]
        return accepted, bonus

    def _draft(self, anchor, start, verify, context, context_start, cache, params, generator):
        prefix, drafts, proposals = self.history[:start + 1], [], []
        for _ in range(verify - 1):
            key = tuple(prefix + drafts)
            if key not in self.best:  # draws share prefixes: one target pass per distinct prefix
                cache, known = copy.deepcopy(self.prompt.cache), len(self.prompt.prompt_ids)
                logits, _ = self.target.forward(torch.tensor([list(key[known:])]),
                                                torch.arange(known, len(key))[None], cache=cache, logits_to_keep=1)
                self.best[key] = int(target_probs(logits[0, -1], params).argmax())
            best = self.best[key]
            drafts.append(best)
            proposals.append(torch.nn.functional.one_hot(torch.tensor(best), self.target.vocab_size).float())
        return drafts, torch.stack(proposals), None


def default_check(target, decoder) -> dict:
    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    prompts = [render_prompt(target.tokenizer, list(p.messages)) for p in holdout[:recipe.SAMPLING_PROMPTS]]
    params = SamplingParams(temperature=1.0)  # what validation tests a greedy job with
    return sampling_lossless_test(decoder, prompts, params, draws=recipe.SAMPLING_DRAWS, seed=recipe.SEED)


@pytest.mark.slow
def test_check_rejects_a_decoder_that_resamples_from_p(smollm2, monkeypatch):
    monkeypatch.setattr(trainer.sampling, "residual_distribution", lambda p, q: p)
    result = default_check(smollm2, GreedyTargetDrafter(smollm2, recipe.BLOCK_SIZE))
    assert result["groups_by_position"].get(2, 0) >= 3  # speculative positions are tested, not just the prefill
    assert result["p_value"] < SAMPLING_ALPHA
