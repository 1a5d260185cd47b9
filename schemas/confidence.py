"""report.json's `confidence` section, typed: the drafter's calibrated confidence (trainer/confidence.py fits it,
trainer/validation/confidence_report.py measures it) and the adaptive-length row. The map itself also ships in the
drafter's config.json as `draftsmith.confidence` (docs/CONFIDENCE.md: the key, and which engines read what).

A module of its own beside schemas/validation_report.py, which keeps report.json's other sections. Pure pydantic, strict
under mypy like the rest of schemas/.
"""

from __future__ import annotations

from pydantic import Field

from schemas.work_files import LenientModel


class ConfidenceMapFigure(LenientModel):
    """Knots of a piecewise-linear, non-decreasing map from the drafter's score to P(accepted | earlier accepted)."""

    method: str | None = None
    score: list[float] | None = Field(default=None, description="The knots' scores, rising.")
    acceptance: list[float] | None = Field(default=None, description="Calibrated acceptance at each knot.")


class AdaptiveLengthRow(LenientModel):
    """The decoder's confidence-driven draft length against the fixed block, replayed on the held-out prompts."""

    measured_by: str | None = None
    fixed_block_size: int | None = Field(default=None, description="The fixed block compared against (recommended).")
    tau: float | None = Field(default=None, description="tau with the adaptive length (drafts verified per cycle "
                                                        "chosen from the calibrated confidence).")
    tau_fixed: float | None = None
    tau_ratio: float | None = None
    tau_ratio_ci95: list[float] | None = None
    mean_verified_drafts: float | None = None
    estimated_speedup: float | None = Field(default=None, description="Over the target alone, from the measured "
                                                                      "step costs.")
    estimated_speedup_fixed: float | None = None
    speed_ratio: float | None = Field(default=None, description="Adaptive tokens/s over the fixed block's, from the "
                                                                "measured step costs.")
    speed_ratio_ci95: list[float] | None = None


class ConfidenceFigures(LenientModel):
    """How well the drafter's score predicts acceptance on held-out cycles, and the map fitted on them."""

    score: str | None = Field(default=None, description="What the score is (the selector's top-1 probability, or "
                                                        "the drafter's top-1 token probability).")
    positions: int | None = Field(default=None, description="(score, accepted) pairs: positions the cycles reached.")
    prompts: int | None = None
    acceptance_rate: float | None = None
    auc: float | None = Field(default=None, description="P(an accepted position scores above a rejected one).")
    ece: float | None = Field(default=None, description="Expected calibration error of the map, fitted and read on "
                                                        "different prompts.")
    ece_uncalibrated: float | None = Field(default=None, description="The raw score's, read as a probability.")
    ece_bins: int | None = None
    ece_measured_by: str | None = None
    map: ConfidenceMapFigure | None = None
    adaptive_length: AdaptiveLengthRow | None = None
