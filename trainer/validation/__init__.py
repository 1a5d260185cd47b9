"""Proof that a drafter is lossless, and how much it speeds decoding up.

The validation defaults are the recipe's (schemas/recipe.py), shared by `draftsmith validate`, `draftsmith run`,
the bench and the service; this module stays free of torch so the command line can read them cheaply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.recipe import SAMPLING_DRAWS, SAMPLING_PROMPTS, VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS

if TYPE_CHECKING:
    from schemas.sampling import SamplingParams
    from trainer.data.prompts import Prompt
    from trainer.targets.loading import Target

__all__ = ["RENDERED_BY", "SAMPLING_DRAWS", "SAMPLING_PROMPTS", "VALIDATION_MAX_NEW_TOKENS", "VALIDATION_PROMPTS",
           "served_prompt_ids"]

RENDERED_BY = ("the target's chat template with the job's options and each prompt's tools: the call regeneration "
               "makes (trainer/data/regenerate.py `tokenize_prompts`)")


def served_prompt_ids(target: Target, prompts: list[Prompt], params: SamplingParams) -> list[list[int]]:
    """The prompts' token ids in the serving mode, by the very call that rendered the training data, so that no
    drafter is measured in a mode its data was not regenerated in."""
    from trainer.data.regenerate import tokenize_prompts

    return tokenize_prompts(target, prompts, params)
