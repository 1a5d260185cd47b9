"""report.json, typed: what validation measured (trainer/validation/report.py writes it through `ValidationReport`),
read by the export (model card, report.html), the audit, the CLI, the worker and the dashboard.

Versions. `version` is REPORT_VERSION in every report written since this model exists. A report without it was
written before (stored reports, the sample job): it is read as version 1, since version 1 *is* the shape validation
wrote then; fields added over the years are optional, so an older report simply lacks some. A change that renames or
reshapes a field bumps REPORT_VERSION and says here how the older shape is read.

Reading is lenient, as report.json's readers always were: every field has a default (None: the figure is missing and
shows as "–"), keys this model does not know are kept (`extra="allow"`: a newer writer's additions survive a round
trip), and `ValidationReport.read` drops a top-level field whose value does not fit its type rather than fail (an odd
or hand-edited report still renders). Writing is exact: `to_json()` gives back the keys that were set, in the
model's field order (version, passed, block_size, tau first): report.json's keys and values as before (+ `version`).

One measurement's figures are declared once (`MeasuredFigures`, `AcceptanceFigures`): an audit's result and a
drafter's metrics inherit them rather than repeat them.

The JSON Schema of this model (`report_json_schema`) is committed as report/static/validation_report.schema.json,
which the dashboard reads (tests/test_validation_report.py keeps the two equal). Pure pydantic: no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from schemas.confidence import ConfidenceFigures
from schemas.work_files import LenientModel, TargetSelfTest

REPORT_VERSION = 1
"""The shape validation writes now; a report without `version` is version 1 (module docstring)."""


class _Part(LenientModel):
    """A section of report.json: unknown keys kept, every field optional; `to_json()` is the section as report.json
    holds it (the fields that were set, so an older report stays as it was; block sizes as string keys)."""


class AcceptanceAtPosition(_Part):
    """Counts behind the acceptance at one draft position (trainer/validation/acceptance.py `by_position`)."""

    position: int | None = None
    reached: int | None = None
    accepted: int | None = None
    offered: int | None = None
    conditional: float | None = Field(default=None, description="Accepted of the cycles that reached this position.")
    unconditional: float | None = Field(default=None, description="P(drafts 1..k all accepted).")


class CategoryAcceptance(_Part):
    tau: float | None = None
    cycles: int | None = None


class TauAtTemperature(_Part):
    """Mean acceptance length at one set of sampling parameters, on the validation prompts, with a 95 % percentile
    bootstrap interval over prompts (trainer/validation/sampled_acceptance.py `tau_figure`)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tau: float | None = Field(default=None, description="Tokens per verify pass, bonus token counted: 1 to block_size.")
    ci95: list[float] | None = Field(default=None, description="95 % bootstrap interval of tau, prompts resampled.")
    prompts: int | None = None
    tokens: int | None = Field(default=None, description="Tokens emitted over all prompts.")
    cycles: int | None = None
    block_size: int | None = None
    seed: int | None = None
    measured_by: str | None = None
    same_as_greedy: bool | None = Field(default=None, description="The job is greedy (temperature 0): this is the "
                                        "T=0 figure, not measured a second time.")


class StepCosts(_Part):
    """Median milliseconds to verify b tokens (b = 1: a plain decode step) and to draft a block of b."""

    verify: dict[int, float] | None = None
    draft: dict[int, float] | None = None
    draft_vocab_size: int | None = None
    repeats: int | None = None
    threads: int | None = None


class FirstDivergence(_Part):
    prompt_id: str | None = None
    position: int | None = None
    expected: list[int] | None = None
    got: list[int] | None = None


class GreedyCheck(_Part):
    """The greedy exact-match check: speculative output against the target's, token for token."""

    prompts: int | None = None
    tokens: int | None = None
    mismatches: int | None = Field(default=None, description="Prompts whose speculative output differed.")
    first_divergence: FirstDivergence | None = None
    block_size: int | None = None


class SamplingTest(_Part):
    """The speculative-sampling distribution test (trainer/validation/sampling_test.py)."""

    status: str | None = Field(default=None, description="passed | failed | inconclusive (it tested nothing).")
    reason: str | None = Field(default=None, description="Why an inconclusive test could test nothing.")
    test: str | None = None
    p_value: float | None = None
    chi_square_p: float | None = None
    pit_ks_p: float | None = None
    statistic: float | None = None
    degrees_of_freedom: int | None = None
    pit_tokens: int | None = None
    draws: int | None = None
    prompts: int | None = None
    groups: int | None = None
    groups_by_position: dict[int, int] | None = None
    cells: int | None = None
    tested_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    alpha: float | None = None
    passed: bool | None = None
    block_size: int | None = None

    def verdict(self) -> str:
        """"passed", "failed", "inconclusive" or "" (unknown): `status` where the report has it, else the older
        reports' `passed` flag."""
        if self.status in ("passed", "failed", "inconclusive"):
            return self.status
        if self.passed is None:
            return ""
        return "passed" if self.passed else "failed"


class Lossless(_Part):
    greedy: GreedyCheck | None = None
    sampling: SamplingTest | None = None


class Speedup(_Part):
    """The measured speedup: the timed prompts decoded at batch 1 by the target alone, then speculatively."""

    decoding: str | None = None
    block_size: int | None = None
    prompts: int | None = None
    tau: float | None = None
    ar_tokens_per_s: float | None = None
    spec_tokens_per_s: float | None = None
    ratio: float | None = Field(default=None, description="Target alone's time over the speculative time.")
    ratio_ci95: list[float] | None = Field(default=None, description="95 % bootstrap interval of the ratio.")
    load_average: list[float] | None = None


class ServingAdvice(_Part):
    enable: bool | None = Field(default=None, description="True: enable; False: it slows serving; None: unclear.")
    summary: str | None = None


class DeviceDescription(_Part):
    """Where validation ran (trainer/device.py `DevicePlan.describe`)."""

    setting: str | None = None
    device: str | None = None
    type: str | None = None
    name: str | None = None
    count: int | None = None
    dtype: str | None = None


class GreedyGate(_Part):
    """What the greedy exact-match check compares (trainer/validation/report.py `greedy_gate`)."""

    dtype: str | None = None
    device: str | None = None
    prompts: int | None = None
    every_prompt: bool | None = None
    block_size: int | None = None
    verify_width: int | None = None
    reference: str | None = None


class ServingMode(_Part):
    """The mode the target serves in, which its training data was regenerated in and every tau of the report was
    measured in: the chat template's options and the sampling parameters. A drafter is never judged in a mode it
    will not serve (acceptance collapses when thinking on/off differs between data and serving). The system prompt
    itself is not repeated here, only whether there is one and its SHA-256."""

    enable_thinking: bool | None = Field(default=None, description="Passed to the chat template; None: the "
                                         "template's own default.")
    has_system_prompt: bool | None = Field(default=None, description="A system prompt is prepended to every "
                                           "conversation that has none.")
    system_prompt_sha256: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    rendered_by: str | None = Field(default=None, description="How prompts become tokens, in regeneration and "
                                    "validation alike.")

    @classmethod
    def of(cls, sampling: Mapping[str, Any] | None, rendered_by: str | None = None) -> ServingMode | None:
        """The serving mode of a job's sampling parameters (SamplingParams' JSON); None when they are unknown."""
        if sampling is None:
            return None
        template = sampling.get("chat_template") or {}
        system = template.get("system_prompt")
        mode = cls(enable_thinking=template.get("enable_thinking"), has_system_prompt=bool(system),
                   system_prompt_sha256=hashlib.sha256(system.encode()).hexdigest() if system else None,
                   temperature=sampling.get("temperature"), top_p=sampling.get("top_p"), top_k=sampling.get("top_k"))
        if rendered_by is not None:
            mode.rendered_by = rendered_by
        return mode

    def summary(self) -> str:
        """One line for the card, report.html and the dashboard: `thinking off, system prompt 1a2b3c4d, T=0.7,
        top-p 0.9, top-k 50`."""
        thinking = {True: "thinking on", False: "thinking off", None: "thinking: the template's default"}
        parts = [thinking[self.enable_thinking],
                 f"system prompt {self.system_prompt_sha256[:8]}" if self.system_prompt_sha256 else "no system prompt"]
        if self.temperature is not None:
            parts.append("greedy (T=0)" if self.temperature == 0 else f"T={self.temperature:g}")
        if self.temperature and self.top_p is not None and self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        if self.temperature and self.top_k:
            parts.append(f"top-k {self.top_k}")
        return ", ".join(parts)


WARM_START_ADVICE = ("keep_parent", "serve_new")
"""What a warm-started job says to serve: its parent, unless the paired gain's interval lies above 1."""


class PairedGain(_Part):
    """The new drafter against its parent at one set of sampling parameters, on the same prompts with the same
    seeds: tau(new) / tau(parent) with a 95 % paired percentile-bootstrap interval (prompts resampled together,
    trainer/bootstrap.py `paired_ratio_interval`)."""

    temperature: float | None = None
    parent_tau: float | None = None
    tau: float | None = None
    ratio: float | None = Field(default=None, description="tau(new) / tau(parent).")
    ci95: list[float] | None = Field(default=None, description="95 % paired bootstrap interval of the ratio.")
    difference: float | None = Field(default=None, description="tau(new) - tau(parent).")
    difference_ci95: list[float] | None = None
    prompts: int | None = None
    seed: int | None = None


class WarmStartParent(_Part):
    """Where a warm start's parent came from and what starting from it changed (prepare's record of it,
    schemas/work_files.py `PreparedParent.origin`, where prepare wrote one)."""

    name: str | None = Field(default=None, description="The parent as the job named it (init.from_drafter: a URI "
                             "or drf_ id), else where prepare read it.")
    format: str | None = Field(default=None, description="Its checkpoint format, recognised by content: draftsmith, "
                               "z-lab, speculators or specforge.")
    variant: str | None = Field(default=None, description="The parent's own method: dflash, dflash2 or dspark.")
    architecture: str | None = None
    upgrades: list[str] | None = Field(default=None, description="What the job changed, e.g. DFlash to DFlash 2.")
    dropped_tensors: list[str] | None = Field(default=None, description="Parent tensors not carried over, each with "
                                              "the reason.")
    notes: list[str] | None = None


class DrafterAdapterFigures(_Part):
    """A drafter adapter's size (training.drafter_adapter, trainer/training/drafter_adapter.py): a LoRA over the
    parent's layers and projection trained instead of every weight, shipped as drafter-adapter/ beside the merged
    drafter that is served. The report's tau is the merged drafter's; a full specialisation at the same budget is
    bench/specialise.py's `specialised` row beside its `adapter` row (docs/RESULTS.md)."""

    rank: int | None = Field(default=None, description="LoRA rank of every adapted projection.")
    alpha: float | None = Field(default=None, description="LoRA alpha; the update is alpha / rank x B A.")
    target_modules: list[str] | None = Field(default=None, description="The drafter's projections it adapts.")
    trainable_parameters: int | None = Field(default=None, description="Parameters the adapter holds: all that "
                                             "training changed.")
    drafter_parameters: int | None = Field(default=None, description="Parameters of the whole drafter, what a full "
                                           "specialisation trains.")
    trainable_share: float | None = Field(default=None, description="trainable_parameters / drafter_parameters.")
    bytes: int | None = Field(default=None, description="Size of adapter_model.safetensors on disk.")
    drafter_bytes: int | None = Field(default=None, description="Size of the merged drafter's model.safetensors.")
    folder: str | None = Field(default=None, description="The export's folder holding the PEFT adapter.")


class WarmStart(_Part):
    """A warm start, before and after (trainer/validation/report.py `validate(parent=)`): the parent measured on the
    new target's held-out prompts in the serving mode, at T=0 and at the job's temperature, beside the new drafter
    on the same prompts, and the paired gain that decides which of the two to serve."""

    parent_tau: float | None = Field(default=None, description="The parent's tau at the job's own sampling "
                                     "parameters (the headline, like `tau`).")
    parent_tau_per_position: list[float | None] | None = None
    parent_acceptance_by_category: dict[str, CategoryAcceptance] | None = None
    tau: float | None = None
    gain_over_parent: float | None = Field(default=None, description="tau - parent_tau.")
    prompts: int | None = None
    parent_tau_greedy: TauAtTemperature | None = Field(default=None, description="The parent's tau at T=0.")
    parent_tau_sampled: TauAtTemperature | None = Field(default=None, description="The parent's tau at the job's "
                                                        "sampling parameters (the T=0 figure for a greedy job).")
    tau_greedy: TauAtTemperature | None = Field(default=None, description="The new drafter's tau at T=0 (the "
                                                "report's `tau_greedy`).")
    tau_sampled: TauAtTemperature | None = None
    gain_greedy: PairedGain | None = None
    gain_sampled: PairedGain | None = Field(default=None, description="The paired gain at the job's parameters: "
                                            "what `advice` follows.")
    advice: str | None = Field(default=None, description=f"One of {', '.join(WARM_START_ADVICE)}: keep serving the "
                               "parent unless the paired gain's interval lies above 1.")
    advice_reason: str | None = None
    serving_mode: ServingMode | None = None
    parent: WarmStartParent | None = None
    adapter: DrafterAdapterFigures | None = Field(default=None, description="A drafter adapter job's LoRA: its size "
                                                  "against the drafter's (null: every weight was trained).")

    @property
    def keep_parent(self) -> bool:
        return self.advice == "keep_parent"


class EqualCount(_Part):
    equal: int | None = None
    of: int | None = None


class EngineRow(_Part):
    """One serving-engine run (trainer/validation/engines.py `_row`); `refused` or `error` when it did not run."""

    name: str | None = None
    target: str | None = None
    drafter: str | None = None
    spec: str | None = None
    n_max: int | None = None
    p_min: int | float | None = None
    tau: int | float | None = None
    tokens_per_target_step: int | float | None = None
    tokens_per_s: int | float | None = None
    command: str | None = None
    engine: str | None = None
    refused: str | None = None
    error: str | None = None
    ratio: int | float | None = None
    greedy_equals_engine_target: EqualCount | None = None
    greedy_equals_reference_target: EqualCount | None = None
    why_not_reference: str | None = None

    @property
    def did_not_run(self) -> bool:
        """The engine refused the setting or failed (the row carries `refused` or `error`)."""
        return bool({"refused", "error"} & self.model_fields_set)


class EngineFigures(_Part):
    """The `engines` section (trainer/validation/engines.py `run_engines`)."""

    prompts: int | None = None
    max_new_tokens: int | None = None
    threads: int | None = None
    decoding: str | None = None
    skipped: list[str] = Field(default_factory=list)
    rows: list[EngineRow] = Field(default_factory=list)
    vllm: dict[str, Any] | None = None
    seconds: float | None = None
    load_average: list[float] | None = None
    prompt_ids: list[str] | None = None


class TrainingObjective(_Part):
    """What the drafter was trained to optimise (trainer/training/objective.py, position_weights.py)."""

    position_weighting: str | None = Field(default=None, description="`decay` (fixed exp(-(k-1)/gamma)) or `dpace` "
                                           "(D-PACE: weights from the drafter's own confidence).")
    decay_gamma: float | None = Field(default=None, description="gamma of the fixed decay (with `decay`).")
    dpace_alpha: float | None = Field(default=None, description="D-PACE's smoothing alpha (with `dpace`).")
    acceptance_loss_weight: float | None = Field(default=None, description="Weight of the expected-acceptance "
                                                 "term beside the cross-entropy; 0: off.")
    summary: str | None = Field(default=None, description="One line for the model card.")


class TargetDescription(_Part):
    """The target the drafter was made for: as the job named it, and what its family is
    (trainer/targets/families.py `describe`)."""

    name: str | None = Field(default=None, description="The job's target: its URI, or the folder given locally.")
    adapter: bool | None = Field(default=None, description="The target is a LoRA adapter merged into `base`.")
    base: str | None = Field(default=None, description="An adapter target's base model, as the job named it.")
    family: str | None = None
    model_type: str | None = None
    layer_kinds: dict[str, int] | None = Field(default=None, description="Decoder layers per kind, read from the "
                                               "model: full, sliding (window), chunked, linear (a recurrent "
                                               "state), conv (a short convolution's state), none (no cache), other.")
    rollback: str | None = Field(default=None, description="How a verify is taken back: crop, or replay "
                                 "(restore the saved recurrent state and replay the accepted tokens).")
    rollback_by_kind: dict[str, str] | None = Field(default=None, description="Each layer kind's rollback.")
    tied_head: bool | None = Field(default=None, description="The LM head is the embedding table.")
    moe: bool | None = None
    active_expert_fraction: float | None = None
    embedding_scale: float | None = None
    final_logit_softcap: float | None = None
    engines: list[str] | None = Field(default=None, description="Engines that serve a DFlash drafter for "
                                      "this family today.")
    engines_note: str | None = None
    gguf: bool | None = Field(default=None, description="The family's vocabulary is one the GGUF writer exports.")
    self_test: TargetSelfTest | None = Field(default=None, description="The target's self-test at prepare "
                                             "(prepare.json's): speculative decoding against the target alone.")


class _ReportHead(_Part):  # report.json's first keys: the model's field order is the file's key order
    version: int = Field(default=1, description=f"The report's shape; absent: 1. Written now: {REPORT_VERSION}.")
    passed: bool | None = Field(default=None, description="Lossless: the drafter may be published.")


class _TrainedBlock(_Part):  # a base of its own only to keep report.json's key order (MeasuredFigures)
    block_size: int | None = Field(default=None, description="The trained block size.")


class AcceptanceFigures(_Part):
    """A drafter's acceptance in sum: report.json's, an audit's (schemas/audit.py), a drafter's metrics (lineage.py)."""

    tau: float | None = Field(default=None, description="Mean acceptance length at the trained block size.")
    tau_per_position: list[float | None] | None = None
    acceptance_by_category: dict[str, CategoryAcceptance] | None = None
    oracle_tau: float | None = Field(default=None, description="tau with the gold token anywhere in the top-K.")
    recommended_block_size: int | None = Field(
        default=None, description="The block size of the best estimated speedup on the validation machine.")


class MeasuredFigures(AcceptanceFigures, _TrainedBlock):
    """One measurement of a drafter against a target: report.json's, and an audit's on a new target (`AuditResult`).
    Bases in this order: pydantic orders fields base-most first, and report.json starts version, passed, block_size."""

    prompts: int | None = None
    lossless: Lossless | None = None
    speedup: Speedup | None = None
    sampling_parameters: dict[str, Any] | None = Field(default=None, description="The job's SamplingParams.")
    validation_max_new_tokens: int | None = None
    target_fingerprint: str | None = None
    device: DeviceDescription | None = None
    greedy_gate: GreedyGate | None = None
    serving_mode: ServingMode | None = Field(default=None, description="The mode "
                                             "every tau here was measured in: the one the target serves in.")

    def measured_figures(self) -> dict[str, Any]:
        """Every figure by name, typed (None: not measured): what a record repeating them (an audit's) is built of."""
        return {name: getattr(self, name) for name in MeasuredFigures.model_fields}


class ValidationReport(MeasuredFigures, _ReportHead):
    """report.json: the validation report of one drafter (trainer/validation/report.py's docstring: what is
    measured, and how)."""

    # Its measured figures are MeasuredFigures' fields, shared with an audit's result; the rest are validation's own.

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-report-version": REPORT_VERSION})

    tau_greedy: TauAtTemperature | None = Field(default=None, description="tau at T=0, by replay of the target's "
                                                "greedy output.")
    tau_sampled: TauAtTemperature | None = Field(default=None, description="tau at the job's own sampling parameters, "
                                                 "measured by speculative sampling (the T=0 figure for a greedy job).")
    acceptance_by_position: list[AcceptanceAtPosition] | None = None
    cycles: int | None = None
    acceptance_measured_by: str | None = None
    expected_tau_by_block_size: dict[int, float] | None = None
    estimated_speedup_by_block_size: dict[int, float] | None = None
    step_costs_ms: StepCosts | None = None
    serving_advice: ServingAdvice | None = None
    target: TargetDescription | None = None
    training_objective: TrainingObjective | None = None
    warm_start: WarmStart | None = None
    engines: EngineFigures | None = None
    confidence: ConfidenceFigures | None = Field(default=None, description="The drafter's calibrated confidence "
                                                 "(schemas/confidence.py) and the adaptive-length row.")

    # `read` (a report from report.json's object, or None: an empty one) and `load` (a report.json file) are the
    # work files' lenient reader (schemas/work_files.py LenientModel), one rule for every file a stage leaves.

    @property
    def greedy(self) -> GreedyCheck:
        return (self.lossless.greedy if self.lossless else None) or GreedyCheck()

    @property
    def sampling(self) -> SamplingTest:
        return (self.lossless.sampling if self.lossless else None) or SamplingTest()


def report_json_schema() -> dict[str, Any]:
    """The JSON Schema of report.json, as report/static/validation_report.schema.json holds it."""
    return ValidationReport.model_json_schema(mode="serialization")


def report_json_schema_text() -> str:
    return json.dumps(report_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m schemas.validation_report: rewrite the committed schema after a change
    target = Path(__file__).resolve().parents[1] / "report" / "static" / "validation_report.schema.json"
    target.write_text(report_json_schema_text())
    print(f"wrote {target}")
