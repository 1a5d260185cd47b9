"""Proof that a drafter is lossless, and how much it speeds decoding up.

The defaults below are shared by `draftsmith validate`, `draftsmith run` and the bench; this module stays
free of torch so the command line can read them cheaply."""

VALIDATION_PROMPTS = 24
"""Held-out prompts decoded (greedy exact match, acceptance, timing)."""
VALIDATION_MAX_NEW_TOKENS = 96
"""Tokens generated per validation prompt."""
SAMPLING_DRAWS = 300
"""Draws of the speculative-sampling chi-square test."""
