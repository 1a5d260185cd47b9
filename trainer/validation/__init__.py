"""Proof that a drafter is lossless, and how much it speeds decoding up.

The validation defaults are the recipe's (schemas/recipe.py), shared by `draftsmith validate`, `draftsmith run`,
the bench and the service; this module stays free of torch so the command line can read them cheaply."""

from schemas.recipe import SAMPLING_DRAWS, SAMPLING_PROMPTS, VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS

__all__ = ["SAMPLING_DRAWS", "SAMPLING_PROMPTS", "VALIDATION_MAX_NEW_TOKENS", "VALIDATION_PROMPTS"]
