"""What validation decodes, in one place: trainer/validation/report.py runs this plan, and the estimate
(api/estimates.py), the usage record (worker/usage.py) and the audit count its tokens from it, so a change to
validation's shape changes every figure that describes it.

Validation (report.py's docstring) decodes each validation prompt once with the target alone, in batches (the
references, also replayed for the acceptance), then a timed subset twice at batch 1 (target alone, then
speculatively), then the sampling test's draws (SAMPLED_TOKENS_PER_DRAW tokens each). On a GPU the greedy check
covers every prompt: the rest are decoded speculatively and against the check's reference too (a bfloat16 target's
reference is a decode of its own at verify shapes, a third batch-1 decode of the timed prompts; report.py's
docstring). Pure arithmetic: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TIMED_SHARE = 1 / 3
"""Share of the validation prompts decoded at batch 1 by the target alone and speculatively (timed and
checked token for token); at least TIMED_MIN of them."""
TIMED_MIN = 2
REFERENCE_BATCH = 8
"""Prompts the target answers at once for the references (batched greedy decoding: ~10x the tokens/s)."""
SAMPLED_TOKENS_PER_DRAW = 3
"""Tokens of each speculative-sampling draw (the prefix whose distribution trainer/validation/sampling_test.py
tests)."""


def timed_prompt_count(prompts: int) -> int:
    """Validation prompts in the timed, token-for-token checked subset."""
    return min(prompts, max(TIMED_MIN, math.ceil(prompts * TIMED_SHARE)))


def gated_prompt_count(prompts: int, *, every_prompt: bool = False) -> int:
    """Validation prompts whose speculative output the greedy check compares token for token: the timed subset, or
    every prompt (on a GPU)."""
    return prompts if every_prompt else timed_prompt_count(prompts)


@dataclass(frozen=True)
class ValidationTokens:
    """Tokens validation decodes, split by how they are decoded (upper bounds: every answer to max_new_tokens)."""

    batched: int
    """The references: every prompt once, REFERENCE_BATCH at a time."""
    batch_one: int
    """The greedy check's prompts, twice (speculative and its reference), at batch 1; plus the timed subset alone
    when the reference is not the plain decode (bfloat16)."""
    sampled: int
    """The sampling test's draws."""

    @property
    def total(self) -> int:
        return self.batched + self.batch_one + self.sampled


def validation_tokens(prompts: int, max_new_tokens: int, sampling_draws: int, *, every_prompt: bool = False,
                      shaped_reference: bool = False) -> ValidationTokens:
    """`every_prompt`: the greedy check covers every prompt (a GPU); `shaped_reference`: its reference is a decode of
    its own (bfloat16), not the timed decode of the target alone. The defaults are a CPU's float32 run."""
    decodes = 2 * gated_prompt_count(prompts, every_prompt=every_prompt) + (timed_prompt_count(prompts)
                                                                           if shaped_reference else 0)
    return ValidationTokens(batched=prompts * max_new_tokens,
                            batch_one=decodes * max_new_tokens,
                            sampled=sampling_draws * SAMPLED_TOKENS_PER_DRAW)
