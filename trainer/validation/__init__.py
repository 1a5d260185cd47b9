"""Proof that a drafter is lossless, and how much it speeds decoding up."""
