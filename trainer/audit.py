"""Drift audit: how an existing drafter does against a (new) target checkpoint, and what to do about it.

    result = audit_drafter(target, "drafter/", prompts, params, reference_tau=1.33)
    result.recommendation.action            # keep | warm_start | retrain (an AuditResult: schemas/audit.py)

Customers fine-tune their model again and again; a drafter trained for last month's checkpoint silently loses
acceptance on this month's. An audit measures the drafter against the new checkpoint the way validation
measures a freshly trained one (`trainer.validation.report.validate`: greedy exact match, the sampling test,
tau overall, per position and per category), in minutes, and compares its tau with the tau the drafter had on
its own target (`reference_tau`, from its lineage or its report.json).

Compatibility comes first and is judged by `check_compatible`, the validator's own rule: hidden size,
vocabulary and tapped layers must fit, or the audit stops with a message naming the mismatch. The target
fingerprint (tokenizer + embedding) is reported but does not stop an audit: a new fine-tune that moved the
embeddings is exactly what an audit is for. A drafter whose recorded fingerprint differs is never
recommended as `keep` (our own tools refuse it with the new target until a warm start re-records it).

The recommendation compares the acceptance *gain* (tau - 1: what the drafter buys over decoding alone):

    gain ratio = (tau on the new target - 1) / (reference tau - 1)
    keep        ratio >= keep_min_gain_ratio (0.9), same fingerprint, tau >= min_tau (if set)
    warm_start  ratio >= warm_start_min_gain_ratio (0.25): the weights still carry most of what it learnt
    retrain     otherwise, or when the lossless check failed

`compare_with_parent` is the smaller measurement a warm-started job's validation adds: the parent's tau on the
same held-out prompts and target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from schemas.audit import (
    AuditRecommendation,
    AuditReference,
    AuditResult,
    AuditSpec,
    AuditThresholds,
    Compatibility,
    FieldFit,
    FingerprintFit,
    LayerFit,
)
from schemas.bounds import TargetLimits
from schemas.job_folder import EXPORTED_REPORT
from schemas.sampling import SamplingParams
from schemas.validation_report import ValidationReport
from trainer.data.prompts import Prompt
from trainer.drafter.checkpoint import drafter_folder, load_drafter
from trainer.drafter.model import Drafter
from trainer.errors import DraftsmithError
from trainer.targets.loading import Target
from trainer.training.init import IncompatibleDrafter
from trainer.validation import served_prompt_ids


def drafter_directory(path: str | Path) -> tuple[Path, Path | None]:
    """(the drafter directory, its report.json if one lies beside it). Accepts a drafter directory or an
    exported artifact folder (drafter/ + report.json), as `draftsmith run` and the service write them
    (trainer/drafter/checkpoint.py `drafter_folder`)."""
    folder = drafter_folder(path)
    if folder is None:
        raise DraftsmithError(f"{path} is not a drafter: config.json or *.safetensors is missing (give a drafter "
                              "directory or an exported artifact folder that holds drafter/)")
    report = folder.parent / EXPORTED_REPORT.path
    return folder, report if report.is_file() else None


def compatibility(target: Target, drafter: Drafter) -> Compatibility:
    """What the drafter was built for against what the target is, field by field."""
    c = drafter.config
    return Compatibility(
        hidden_size=FieldFit(drafter=c.hidden_size, target=target.hidden_size, ok=c.hidden_size == target.hidden_size),
        vocab_size=FieldFit(drafter=c.vocab_size, target=target.vocab_size, ok=c.vocab_size == target.vocab_size),
        target_layers=LayerFit(drafter_taps=list(c.target_layer_ids), drafter_built_for=c.num_target_layers,
                               target=target.num_layers, ok=c.num_target_layers == target.num_layers
                               and max(c.target_layer_ids) < target.num_layers),
        fingerprint=FingerprintFit(drafter=c.target_fingerprint, target=target.fingerprint,
                                   same=c.target_fingerprint in (None, target.fingerprint)),
    )


def as_measured(drafter: Drafter) -> Drafter:
    """The drafter with its recorded fingerprint set aside, so that the validator measures it against a new
    checkpoint of the same shape (its shape checks still apply)."""
    drafter.config = drafter.config.replace(target_fingerprint=None)
    return drafter


def check_fits(target: Target, drafter: Drafter) -> None:
    from trainer.validation.report import check_compatible

    try:
        check_compatible(target, drafter)
    except IncompatibleDrafter:
        raise
    except DraftsmithError as error:
        raise IncompatibleDrafter(str(error)) from None


def recommend(tau: float, reference_tau: float | None, *, lossless: bool, same_fingerprint: bool,
              thresholds: AuditThresholds) -> AuditRecommendation:
    ratio = None
    if reference_tau is not None and reference_tau > 1.0 + 1e-9:
        ratio = round((tau - 1.0) / (reference_tau - 1.0), 4)
    floor_ok = thresholds.min_tau is None or tau >= thresholds.min_tau
    if not lossless:
        action, reason = "retrain", "the lossless check failed: this drafter must not be served with this target"
    elif ratio is None:
        if thresholds.min_tau is not None and floor_ok and same_fingerprint:
            action, reason = "keep", f"tau {tau:.3f} >= min_tau {thresholds.min_tau} (no reference tau recorded)"
        else:
            action, reason = "warm_start", ("no reference tau is recorded for this drafter; it fits the target, so "
                                            "a warm start is the cheap way to a drafter trained for it")
    elif ratio >= thresholds.keep_min_gain_ratio and floor_ok and same_fingerprint:
        action, reason = "keep", (f"keeps {ratio:.0%} of its acceptance gain (tau {tau:.3f} vs {reference_tau:.3f} "
                                  f"on its own target; keep at >= {thresholds.keep_min_gain_ratio:.0%})")
    elif ratio >= thresholds.warm_start_min_gain_ratio:
        why = (" and the target's tokenizer/embedding changed" if not same_fingerprint else
               "" if floor_ok else f" and tau is below min_tau {thresholds.min_tau}")
        action, reason = "warm_start", (f"keeps {ratio:.0%} of its acceptance gain (tau {tau:.3f} vs "
                                        f"{reference_tau:.3f}){why}; warm start at >= "
                                        f"{thresholds.warm_start_min_gain_ratio:.0%}")
    else:
        action, reason = "retrain", (f"keeps only {max(ratio, 0):.0%} of its acceptance gain (tau {tau:.3f} vs "
                                     f"{reference_tau:.3f}); below {thresholds.warm_start_min_gain_ratio:.0%}")
    return AuditRecommendation(action=action, reason=reason, gain_ratio=ratio, thresholds=thresholds.model_dump())


def audit_drafter(target: Target, drafter_path: str | Path, prompts: list[Prompt], params: SamplingParams, *,
                  max_new_tokens: int, sampling_draws: int, reference_tau: float | None = None,
                  thresholds: AuditThresholds = AuditThresholds(),
                  on_progress: Callable[[int, int, str], None] | None = None, device_plan=None) -> AuditResult:
    """Measure the drafter at `drafter_path` against `target` on `prompts`; see the module docstring.
    `reference_tau`: its tau on its own target; None reads the report.json beside it, if any.
    Raises IncompatibleDrafter (naming the mismatch) when it cannot run against this target at all."""
    from schemas.validation_plan import validation_tokens
    from trainer.validation.report import validate

    started = time.perf_counter()
    directory, report_file = drafter_directory(drafter_path)
    reference_source = "given" if reference_tau is not None else None
    if reference_tau is None and report_file is not None:
        reference_tau, reference_source = ValidationReport.load(report_file).tau, str(report_file)
    drafter = load_drafter(directory, target.device, target.dtype, num_target_layers=target.num_layers)
    fits = compatibility(target, drafter)
    check_fits(target, as_measured(drafter))
    if not prompts:
        raise DraftsmithError("the audit has no prompts to measure on; give a prompts source with a hold-out")
    report = validate(target, drafter, prompts, params, max_new_tokens=max_new_tokens,
                      sampling_draws=sampling_draws, on_progress=on_progress, device_plan=device_plan)
    same = bool(fits.fingerprint and fits.fingerprint.same)
    return AuditResult.measured(
        report,
        prompts=len(prompts), sampling_parameters=params.model_dump(mode="json"),
        validation_max_new_tokens=max_new_tokens, target_fingerprint=target.fingerprint,
        compatible=True,
        compatibility=fits,
        reference=AuditReference(tau=reference_tau, source=reference_source,
                                 delta=None if reference_tau is None else round(report.tau - reference_tau, 4)),
        recommendation=recommend(report.tau, reference_tau, lossless=report.passed, same_fingerprint=same,
                                 thresholds=thresholds),
        tokens_generated=validation_tokens(len(prompts), max_new_tokens, sampling_draws,
                                           every_prompt=report.greedy_gate.every_prompt,
                                           shaped_reference=report.greedy_gate.verify_width > 1).total,
        minutes=round((time.perf_counter() - started) / 60, 2),
    )


@torch.inference_mode()
def measure_tau(target: Target, drafter: Drafter, prompts: list[Prompt], params: SamplingParams,
                max_new_tokens: int) -> dict:
    """Held-out tau the way validation's first pass measures it: greedy jobs by replaying the drafter against the
    target's own output, sampling jobs by speculative sampling at the job's parameters."""
    from trainer.validation.replay import greedy_references, replay_acceptance
    from trainer.validation.sampled_acceptance import sampled_acceptance

    if params.greedy:
        references = greedy_references(target, prompts, params, max_new_tokens, list(drafter.config.target_layer_ids))
        stats = replay_acceptance(target, drafter, references).stats
    else:
        serving = params.model_copy(update={"max_new_tokens": max_new_tokens})
        stats = sampled_acceptance(target, drafter, prompts, serving).stats
    return {"tau": round(stats.overall.tau, 4),
            "tau_per_position": [None if a is None else round(a, 4) for a in stats.overall.per_position],
            "acceptance_by_category": stats.acceptance_by_category()}


def load_parent(target: Target, parent_path: str | Path) -> Drafter:
    """A warm start's parent drafter, ready to be measured against the new target (its recorded fingerprint set
    aside: a fine-tune moved it), or IncompatibleDrafter naming what does not fit."""
    directory, _ = drafter_directory(parent_path)
    parent = as_measured(load_drafter(directory, target.device, target.dtype, num_target_layers=target.num_layers))
    check_fits(target, parent)
    return parent


def compare_with_parent(target: Target, parent_path: str | Path, prompts: list[Prompt], params: SamplingParams, *,
                        max_new_tokens: int, tau: float, drafter: Drafter | None = None) -> dict:
    """The parent drafter's tau on this target and these held-out prompts, beside the new drafter's: report.json's
    `warm_start`. Given the new `drafter`, both are measured by validation's own passes (the same rendering in the
    serving mode, greedy references and seeds) and the section carries the paired gains and the advice; without
    it, the parent alone, beside the given `tau`."""
    from trainer.validation.report import greedy_outputs, measure_acceptance
    from trainer.validation.sampled_acceptance import parent_comparison

    parent = load_parent(target, parent_path)
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    rendered = served_prompt_ids(target, prompts, greedy)
    references = greedy_outputs(target, rendered, max_new_tokens)
    parent_zero, parent_job = measure_acceptance(target, parent, prompts, rendered, references, params,
                                                 max_new_tokens)
    if drafter is not None:
        new_zero, new_job = measure_acceptance(target, drafter, prompts, rendered, references, params,
                                               max_new_tokens)
        return parent_comparison(new_zero, new_job, parent_zero, parent_job, params,
                                 block_size=drafter.config.block_size, parent_block_size=parent.config.block_size)
    headline = (parent_job or parent_zero).stats
    parent_tau = round(headline.overall.tau, 4)
    return {"parent_tau": parent_tau,
            "parent_tau_per_position": [None if a is None else round(a, 4) for a in headline.overall.per_position],
            "parent_acceptance_by_category": headline.acceptance_by_category(), "tau": tau,
            "gain_over_parent": round(tau - parent_tau, 4), "prompts": len(prompts)}


def audit_prompts(source: str, spec: AuditSpec) -> list[Prompt]:
    """The prompts an audit measures: the hold-out of the (sampled) source, as a job's validation chooses them."""
    from trainer.data.prompts import draw_prompts, split_prompts

    assert spec.data is not None and spec.validation is not None and spec.sampling is not None
    seed = spec.sampling.seed
    prompts = draw_prompts(source, spec.data.count, seed)
    return split_prompts(prompts, spec.data.holdout_share, seed)[1][:spec.validation.prompts]


def run_audit(spec: AuditSpec, *, target: str, drafter: str, prompts: str = "builtin",
              on_progress: Callable[[int, int, str], None] | None = None, device: str = "auto",
              dtype: str = "auto", base: str | None = None, limits: TargetLimits | None = None) -> AuditResult:
    """An audit from end to end, as `draftsmith audit` runs it here and the worker runs it for the service.
    `spec` is resolved (schemas.audit.resolved); `target`, `drafter`, `prompts` are local paths (or a bundled
    target name / `builtin`) the caller fetched from the spec's URIs. `device`, `dtype`: where the target runs
    (schemas/compute.py; the worker passes its DRAFTSMITH_WORKER_DEVICE), decided by trainer/device.py."""
    from trainer.device import resolve_device
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path

    assert spec.sampling is not None and spec.validation is not None and spec.thresholds is not None
    chosen = audit_prompts(prompts, spec)  # a bad prompts file fails before the target is loaded
    plan = resolve_device(device, dtype)
    loaded = load_target(resolve_target_path(target), device=plan.device, dtype=plan.dtype,
                         allow_pickle=spec.target.allow_pickle, trust_remote_code=spec.target.trust_remote_code,
                         base=resolve_target_path(base) if base else None, limits=limits)
    return audit_drafter(loaded, drafter, chosen, spec.sampling, max_new_tokens=spec.validation.max_new_tokens,
                         sampling_draws=spec.validation.sampling_draws, reference_tau=spec.reference_tau,
                         thresholds=spec.thresholds, on_progress=on_progress, device_plan=plan)
