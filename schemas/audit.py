"""A drift audit request: which drafter, against which target checkpoint, on which prompts, judged by which
thresholds. Pure pydantic, like the job spec: the API validates a body with it (`POST /v1/audits`), the CLI
builds one from its flags (`draftsmith audit`), and the worker and the trainer read the very same object.

    {"drafter": "drf_01J...", "target": {"uri": "hf://acme/support-llama@v4"}}

Defaults: for a drafter of the organisation (`drf_...`) the audit measures on the prompts, sampling parameters
and validation settings of the job that trained it (so auditing it against its own target reproduces its
validation tau), and compares with that tau; for a drafter URI, the built-in prompts' hold-out and greedy
decoding, compared with the tau of a report.json beside the drafter if there is one. Thresholds: the request's,
else the organisation's (`PUT /v1/audit-thresholds`), else the defaults below.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from schemas import recipe
from schemas.job_spec import (
    READ_CREDENTIALS,
    DataSpec,
    StrictModel,
    TargetSpec,
    ValidationSpec,
    _file_roots,
    check_drafter_ref,
)
from schemas.sampling import SamplingParams
from schemas.validation_report import Lossless, MeasuredFigures, ValidationReport
from schemas.work_files import LenientModel, VersionedFile

KEEP_MIN_GAIN_RATIO = 0.9
"""Keep a drafter that still has this share of its acceptance gain (tau - 1) on the new target."""
WARM_START_MIN_GAIN_RATIO = 0.25
"""Warm-start from a drafter that keeps at least this share; below it, retrain."""
AUDIT_ACTIONS = ("keep", "warm_start", "retrain")


class AuditThresholds(StrictModel):
    """When an audit says keep, warm start or retrain (trainer/audit.py `recommend`):

    gain ratio = (tau on the new target - 1) / (reference tau - 1);
    keep at >= keep_min_gain_ratio (and tau >= min_tau, if set, and an unchanged target fingerprint),
    warm_start at >= warm_start_min_gain_ratio, retrain below (or when the lossless check fails)."""

    keep_min_gain_ratio: float = Field(default=KEEP_MIN_GAIN_RATIO, ge=0.0, le=2.0)
    warm_start_min_gain_ratio: float = Field(default=WARM_START_MIN_GAIN_RATIO, ge=0.0, le=2.0)
    min_tau: float | None = Field(default=None, ge=1.0, le=64.0,
                                  description="An absolute floor for keep (the only rule when no reference tau is known).")

    @model_validator(mode="after")
    def _ordered(self) -> AuditThresholds:
        if self.warm_start_min_gain_ratio > self.keep_min_gain_ratio:
            raise ValueError(f"warm_start_min_gain_ratio ({self.warm_start_min_gain_ratio}) must not exceed "
                             f"keep_min_gain_ratio ({self.keep_min_gain_ratio})")
        return self


class AuditSpec(StrictModel):
    """One audit. Unset sections are resolved when the audit is admitted (see the module docstring)."""

    drafter: str = Field(
        max_length=2048,
        description="A drafter of your organisation (`drf_...`) or the URI of a drafter directory / exported "
        f"artifact folder: hf://org/name[@revision], s3://bucket/prefix, file:///path. {READ_CREDENTIALS}",
    )
    target: TargetSpec = Field(description="The (new) target checkpoint to measure the drafter against.")
    sampling: SamplingParams | None = Field(default=None, description="Default: the drafter's job's, else greedy.")
    data: DataSpec | None = Field(default=None, description="Prompts: the hold-out of this source is measured. "
                                  "Default: the drafter's job's, else the built-in set.")
    validation: ValidationSpec | None = Field(default=None, description="Prompts measured, tokens per prompt, "
                                              "sampling-test draws. Default: the drafter's job's, else the recipe's.")
    thresholds: AuditThresholds | None = Field(default=None, description="Default: the organisation's.")
    reference_tau: float | None = Field(
        default=None, ge=1.0, le=64.0,
        description="The drafter's tau on its own target, to compare with. Default: its recorded validation tau.")

    @field_validator("drafter")
    @classmethod
    def _valid_ref(cls, value: str, info: ValidationInfo) -> str:
        return check_drafter_ref(value, _file_roots(info))


def resolved(spec: AuditSpec, *, sampling: SamplingParams | None = None, data: DataSpec | None = None,
             validation: ValidationSpec | None = None, thresholds: AuditThresholds | None = None,
             reference_tau: float | None = None) -> AuditSpec:
    """The spec with every unset section filled from the given defaults (the drafter's job's, the organisation's),
    then the recipe's."""
    return spec.model_copy(update={
        "sampling": spec.sampling or sampling or SamplingParams(),
        "data": spec.data or data or DataSpec(),
        "validation": spec.validation or validation or ValidationSpec(prompts=recipe.VALIDATION_PROMPTS),
        "thresholds": spec.thresholds or thresholds or AuditThresholds(),
        "reference_tau": spec.reference_tau if spec.reference_tau is not None else reference_tau,
    })


# --- the audit's result: what trainer/audit.py measured, stored on the audit row and printed by the CLI ---------


class FieldFit(LenientModel):
    """One shape field of the drafter against the target's."""

    drafter: int | None = None
    target: int | None = None
    ok: bool | None = None


class LayerFit(LenientModel):
    drafter_taps: list[int] | None = None
    drafter_built_for: int | None = Field(default=None, description="The target depth the drafter was built for.")
    target: int | None = None
    ok: bool | None = None


class FingerprintFit(LenientModel):
    drafter: str | None = Field(default=None, description="The fingerprint the drafter recorded (None: none).")
    target: str | None = None
    same: bool | None = None


class Compatibility(LenientModel):
    """What the drafter was built for against what the target is (trainer/audit.py `compatibility`)."""

    hidden_size: FieldFit | None = None
    vocab_size: FieldFit | None = None
    target_layers: LayerFit | None = None
    fingerprint: FingerprintFit | None = None


class AuditLossless(Lossless):
    passed: bool | None = Field(default=None, description="Both lossless checks passed.")


class AuditReference(LenientModel):
    """The tau the audit compares with: the drafter's on its own target."""

    tau: float | None = None
    source: str | None = Field(default=None, description="`given` (the request's), or the report.json it came from.")
    delta: float | None = Field(default=None, description="tau on the new target minus the reference tau.")


class AuditRecommendation(LenientModel):
    """trainer/audit.py `recommend`: keep, warm_start or retrain, and why."""

    action: str | None = Field(default=None, description=f"One of {', '.join(AUDIT_ACTIONS)}.")
    reason: str | None = None
    gain_ratio: float | None = Field(default=None, description="(tau - 1) / (reference tau - 1); None: no reference.")
    thresholds: dict[str, Any] | None = Field(default=None, description="The AuditThresholds it was judged by.")


class AuditResult(MeasuredFigures, VersionedFile):
    """An audit's result (the `result` of GET /v1/audits/{id}, `draftsmith audit --json`), read leniently like the
    work files (schemas/work_files.py): results stored before it had a `version` read as version 1. The figures it
    measured are validation's own (`MeasuredFigures`, report.json's fields: tau, speedup, device, ...), so the
    audit's JSON names and types each as report.json does; the rest is the audit's."""

    compatible: bool | None = None
    compatibility: Compatibility | None = None
    lossless: AuditLossless | None = None
    reference: AuditReference | None = None
    recommendation: AuditRecommendation | None = None
    tokens_generated: int | None = None
    minutes: float | None = None
    drafter_revision: str | None = Field(default=None, description="The drafter version fetched (the worker's).")

    @classmethod
    def measured(cls, report: ValidationReport, **fields: Any) -> Self:
        """The result of an audit whose measurement is `report` (validation's, on the new target): its figures as
        report.json holds them, its lossless verdict inside `lossless`, and the audit's own `fields` over them."""
        lossless = AuditLossless.read({"passed": report.passed, **(report.lossless.to_json() if report.lossless else {})})
        return cls.written(**(report.measured_figures() | {"lossless": lossless} | fields))

    @property
    def action(self) -> str | None:
        return self.recommendation.action if self.recommendation else None

    @property
    def passed(self) -> bool:
        """The lossless verdict; a result without one did not pass."""
        return bool(self.lossless and self.lossless.passed)
