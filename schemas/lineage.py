"""A published drafter's record, typed: its shape (`DrafterShape`), its validation metrics (`DrafterMetrics`) and
its lineage (`DrafterLineage`), the three JSON columns of the drafters table.

The drafter's shape, metrics and serving flags are written once, by the export (trainer/export/record.py), as
the artifact `drafter-record.json` (`DrafterRecord`, listed in manifest.json like every exported file); the worker
reads that record at the end of the publish stage and builds the lineage from it and the job's work files
(worker/drafters.py `record_lineage`, through schemas/work_files.py); domain/drafters.py stores them with
`to_json()` and reads them back with `read`; the API shows them as stored. They follow the work files' rules
(schemas/work_files.py): unknown keys kept, a misfitting field dropped on reading, a `version` that is 1 when
absent (the rows recorded before these models); every field optional, but for what drafter-record.json's writer
always writes (`DrafterRecord.shape` and `metrics`, and every field of `RecordedShape`). Pure pydantic: no torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import Field

from schemas.validation_report import (
    AcceptanceFigures,
    DrafterAdapterFigures,
    PairedGain,
    ValidationReport,
    WarmStart,
    WarmStartParent,
)
from schemas.work_files import CodeEnvironment, LenientModel, PinnedSource, VersionedFile

VARIANT_UPGRADES = frozenset({("dflash", "dflash2")})
"""(parent variant, job variant) pairs a warm start bridges (trainer/drafter/upgrade.py): a DFlash parent starts a
DFlash 2 drafter that first drafts the parent's tokens. A DFlash 2 parent has no DFlash form."""
WARM_START_KEEPS = ("num_layers", "mask_token_id")
"""What a job must share with its parent drafter; block size, taps and the draft vocabulary are mapped."""


class DrafterShape(VersionedFile):
    """The drafter's shape, from its exported drafter/config.json: what a warm start from it must match."""

    hidden_size: int | None = None
    vocab_size: int | None = None
    num_target_layers: int | None = None
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    architecture: str | None = None


class RecordedShape(DrafterShape):
    """The shape as drafter-record.json holds it: the export computes every field from the drafter's config
    (trainer/export/record.py), so each is required there."""

    hidden_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    architecture: str


class ServingSettings(LenientModel):
    """How each engine enables the drafter at its recommended block size."""

    sglang: str | None = None
    vllm: dict[str, Any] | None = None
    llama_cpp: str | None = None

    @classmethod
    def at_block(cls, block: int) -> Self:
        """The one spelling of each engine's flags for a block of `block` tokens (the anchor + block - 1 drafts):
        the model card's commands carry them (trainer/export/model_card.py) and drafter-record.json stores them.
        SGLang counts the whole block; vLLM and llama.cpp the drafted tokens."""
        return cls(sglang=f"--speculative-algorithm DFLASH --speculative-num-draft-tokens {block}",
                   vllm={"method": "dflash", "num_speculative_tokens": block - 1},
                   llama_cpp=f"--spec-type draft-dflash --spec-draft-n-max {block - 1}")


class DrafterMetrics(AcceptanceFigures, VersionedFile):
    """What validation measured: report.json's acceptance figures (`AcceptanceFigures`, its own fields), its verdicts
    and speedup ratio flattened, and the parent's tau on the same target."""

    lossless_passed: bool | None = None
    greedy_mismatches: int | None = None
    sampling_p_value: float | None = None
    recommended_block_size: int | None = None
    speedup: float | None = Field(default=None, description="report.json's speedup.ratio.")
    parent_tau: float | None = Field(default=None, description="A warm start's parent on the same prompts.")
    serving: ServingSettings | None = None

    @classmethod
    def measured(cls, report: ValidationReport, serving: ServingSettings) -> Self:
        """The headline figures of a validation report (report.json's model), read through its typed sections."""
        return cls.written(
            tau=report.tau, tau_per_position=report.tau_per_position,
            acceptance_by_category=report.acceptance_by_category, oracle_tau=report.oracle_tau,
            lossless_passed=bool(report.passed), greedy_mismatches=report.greedy.mismatches,
            sampling_p_value=report.sampling.p_value, recommended_block_size=report.recommended_block_size,
            speedup=report.speedup.ratio if report.speedup else None,
            parent_tau=report.warm_start.parent_tau if report.warm_start else None, serving=serving)


class DrafterRecord(VersionedFile):
    """drafter-record.json: the drafter's record as the export writes it, once (trainer/export/record.py), for the
    worker to record at publish without re-deriving any of it: the shape from the drafter's config, the metrics and
    serving flags from its validation report, and what the lineage takes from that report as written (its target
    fingerprint, and a warm start's section: `WarmStart`, report.json's own type)."""

    FILE: ClassVar[str] = "drafter-record.json"
    """Its name among the exported artifacts."""

    shape: RecordedShape
    metrics: DrafterMetrics = Field(description="Validation's headline figures and each engine's serving flags at "
                                    "the recommended block size (`metrics.serving`).")
    target_fingerprint: str | None = Field(default=None, description="report.json's target_fingerprint.")
    warm_start: WarmStart | None = Field(default=None, description="report.json's warm_start, as written.")


class DataSnapshot(LenientModel):
    """The regenerated data set as it is stored."""

    location: str | None = None
    files: int | None = None
    digest: str | None = Field(default=None, description="sha256 over the stored files' names and entries.")


class DataLineage(LenientModel):
    source: str | None = Field(default=None, description="The job's prompts source.")
    source_revision: str | None = None
    count: int | None = None
    holdout_share: float | None = None
    train_prompts: int | None = None
    holdout_prompts: int | None = None
    examples: int | None = None
    response_tokens: int | None = None
    snapshot: DataSnapshot | None = None


class ParentLineage(PinnedSource):
    """A warm start's parent: the reference the job gave, as it was fetched."""

    ref: str | None = Field(default=None, description="init.from_drafter as the job gave it.")
    tau_on_this_target: float | None = None
    origin: WarmStartParent | None = Field(default=None, description="Its format and method as recognised by content, "
                                           "and what the warm start changed (report.json's warm_start.parent).")
    gain: PairedGain | None = Field(default=None, description="The drafter against this parent at the job's sampling "
                                    "parameters (report.json's warm_start.gain_sampled).")
    advice: str | None = Field(default=None, description="keep_parent or serve_new, as report.json gave it.")
    adapter: DrafterAdapterFigures | None = Field(default=None, description="A drafter adapter trained over this "
                                                  "parent instead of every weight (report.json's warm_start.adapter).")


class TrainingLineage(LenientModel):
    steps: int | None = None
    final_loss: float | None = None
    train_tau_estimate: float | None = None


class DrafterLineage(VersionedFile):
    """Everything the drafter came from (domain/drafters.py's module docstring)."""

    target: PinnedSource | None = None
    data: DataLineage | None = None
    parent: ParentLineage | None = None
    recipe: dict[str, dict[str, Any]] | None = Field(
        default=None, description="The job spec's drafter, training, sampling and validation sections.")
    code: CodeEnvironment | None = None
    training: TrainingLineage | None = None
