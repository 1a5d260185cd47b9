"""The greedy gate in bfloat16 (trainer/validation/report.py): both decoders run every forward at the served block's
width to the end of the answer; a divergence at a rounding tie is reported as one; anything else still fails; float32
stays exact."""

from __future__ import annotations

import pytest
import torch

from schemas.sampling import SamplingParams
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.speculative import DecodeResult, SpeculativeDecoder
from trainer.validation.report import _Progress, near_tie, timed_decoding

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
PROMPT = [5, 17, 42, 9, 33, 8]
WIDTH = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_targets import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("tiny-bf16"), "qwen3")


def load(tiny_dir, dtype):
    from trainer.targets import load_target

    return load_target(tiny_dir, dtype=dtype)


class Served:
    """A speculative decoder whose output is given: what a decode at other shapes could have produced."""

    block_size = WIDTH

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def generate(self, ids, params):
        return DecodeResult(tokens=list(self.tokens), prefill_seconds=0.01, decode_seconds=0.01)


def tie_at(target, position: int) -> tuple[list[int], int]:
    """Make a second token's LM-head row equal the reference's token at `position` (so their logits tie there), and
    return the reference output then and the tied token that the reference did not pick."""
    reference = SpeculativeDecoder(target, verify_width=WIDTH)
    chosen = reference.generate(PROMPT, GREEDY).tokens[position]
    twin = next(t for t in range(100, target.vocab_size) if t not in target.stop_token_ids())
    with torch.no_grad():
        target.lm_head.weight[twin] = target.lm_head.weight[chosen]
    expected = reference.generate(PROMPT, GREEDY).tokens
    return expected, twin if expected[position] == chosen else chosen


def check(target, got: list[int]) -> dict:
    _, result = timed_decoding(target, Served(got), [_prompt()], [PROMPT], GREEDY, _Progress(2, None), timed=1,
                               reference=SpeculativeDecoder(target, verify_width=WIDTH))
    return result


def _prompt():
    from trainer.data.prompts import Prompt

    return Prompt(id="p0", category="c", messages=({"role": "user", "content": "x"},))


def test_a_rounding_tie_is_reported_as_a_near_tie_not_a_mismatch(tiny_dir):
    target = load(tiny_dir, torch.bfloat16)
    expected, other = tie_at(target, 3)
    got = expected[:3] + [other] + expected[4:]
    result = check(target, got)
    assert result["mismatches"] == 0 and result["first_divergence"] is None
    (tie,) = result["near_ties"]
    assert tie["prompt_id"] == "p0" and tie["position"] == 3 and tie["got"] == other
    assert tie["logit_gap"] <= 2 * tie["resolution"]
    assert result["tokens"] == 3  # only what could be compared


def test_a_real_divergence_still_fails_in_bfloat16(tiny_dir):
    target = load(tiny_dir, torch.bfloat16)
    expected = SpeculativeDecoder(target, verify_width=WIDTH).generate(PROMPT, GREEDY).tokens
    logits, _ = target.forward(torch.tensor([PROMPT + expected[:3]]), logits_to_keep=1)
    unlikely = int(logits[0, -1].float().argmin())
    assert near_tie(target, PROMPT, expected, expected[:3] + [unlikely], 3) is None
    result = check(target, expected[:3] + [unlikely] + expected[4:])
    assert result["mismatches"] == 1 and result["near_ties"] == []
    assert result["first_divergence"]["position"] == 3 and result["first_divergence"]["got"][0] == unlikely


def test_float32_has_no_near_tie_exemption(tiny_dir):
    target = load(tiny_dir, torch.float32)
    expected, other = tie_at(target, 3)
    result = check(target, expected[:3] + [other] + expected[4:])
    assert result["mismatches"] == 1 and "near_ties" not in result


def test_every_forward_is_the_full_width_to_the_end_of_the_answer(tiny_dir, monkeypatch):
    """The reference (target alone) and the speculative decoder: no forward after the prompt narrower than the
    served block, also where fewer tokens than that remain."""
    target = load(tiny_dir, torch.bfloat16)
    config = DrafterConfig.for_target(target, variant="dflash2", num_layers=1, block_size=WIDTH, mask_token_id=7,
                                      target_layer_ids=[1, 2], selector_rank=8, selector_top_k=8)
    drafter = Drafter(config).to(torch.bfloat16)
    widths = []
    forward = target.forward

    def recording(input_ids, *args, **kwargs):
        widths.append(input_ids.shape[1])
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(target, "forward", recording)
    params = SamplingParams(temperature=0.0, max_new_tokens=7)  # 7 - 1 is no multiple of the block
    for decoder in (SpeculativeDecoder(target, verify_width=WIDTH),
                    SpeculativeDecoder(target, drafter, verify_width=WIDTH)):
        widths.clear()
        result = decoder.generate(PROMPT, params, stop_token_ids=[])
        assert len(result.tokens) == 7
        assert widths[0] == len(PROMPT) and widths[1:] and set(widths[1:]) == {WIDTH}
