"""One mapping from the API's JobSpec to the trainer's RunConfig: every spec field that shapes the ML work
reaches the trainer here, and nowhere else. The worker and `draftsmith run` both build their RunConfig with
`run_config_from_spec`, so the same inputs train the same drafter however the job arrived.

The spec's URIs (target, data source) are the caller's to fetch: it passes the local paths it resolved.
Publishing destinations and labels are the service's business, not the trainer's.
"""

from __future__ import annotations

from schemas.bounds import TargetLimits, file_uri_path
from schemas.job_spec import JobSpec
from trainer.drafter.checkpoint import drafter_folder
from trainer.errors import DraftsmithError
from trainer.pipeline import RunConfig
from trainer.training.config import WARM_START_PREFIX, TrainConfig


def run_config_from_spec(spec: JobSpec, *, target: str, prompts: str = "builtin",
                         parent_drafter: str | None = None, base: str | None = None,
                         target_limits: TargetLimits | None = None) -> RunConfig:
    """`target`: the local target directory (or bundled name) resolved from spec.target.uri; `base`: the local
    base model folder resolved from spec.target.base (an adapter target's); `prompts`:
    `builtin` or the local prompts file resolved from spec.data.source; `parent_drafter`: the local drafter
    directory resolved from spec.init.from_drafter (a file:// URI is read in place when none is given);
    `target_limits`: the largest target the caller's machine loads (None: the defaults)."""
    training = spec.training
    adapter = training.drafter_adapter
    extra = {}  # TrainConfig fields set only when the spec says so
    if training.warmup_share is not None:  # None: TrainConfig's fixed warm-up steps (the CPU recipe's)
        extra["warmup_steps"] = max(1, round(training.warmup_share * training.max_steps))
    if spec.target.base is not None and base is None:
        raise DraftsmithError(f"target.base {spec.target.base!r} must be resolved to a local folder by the caller "
                              "(as target.uri is) and passed as `base`")
    if spec.init is not None:
        extra["init"] = WARM_START_PREFIX + drafter_dir(parent_drafter or _local(spec.init.from_drafter))
    return RunConfig(
        target=target,
        base=base,
        target_name=spec.target.uri,
        base_name=spec.target.base,
        parent_name=spec.init.from_drafter if spec.init is not None else None,
        sampling=spec.sampling,
        prompts=prompts,
        num_prompts=spec.data.count,
        holdout=spec.data.holdout_share,
        generation_shard_size=spec.data.shard_size,
        variant=spec.drafter.variant,
        num_layers=spec.drafter.num_layers,
        block_size=spec.drafter.block_size,
        target_layer_ids=tuple(spec.drafter.target_layer_ids) if spec.drafter.target_layer_ids else None,
        mask_token_id=spec.drafter.mask_token_id,
        allow_pickle=spec.target.allow_pickle,
        trust_remote_code=spec.target.trust_remote_code,
        target_limits=target_limits or TargetLimits(),
        device=spec.compute.device,
        dtype=spec.compute.dtype,
        train=TrainConfig(steps=training.max_steps, max_minutes=training.max_minutes, lr=training.learning_rate,
                          batch_size=training.batch_size, anchors_per_sequence=training.anchors_per_sequence,
                          zero_stage=training.zero_stage, checkpoint_every=training.checkpoint_every,
                          position_weighting=training.position_weighting, dpace_alpha=training.dpace_alpha,
                          acceptance_loss_weight=training.acceptance_loss_weight,
                          # the spec refuses an adapter without init (JobSpec._adapter_needs_parent)
                          drafter_adapter_rank=adapter.rank if adapter else None,
                          drafter_adapter_alpha=adapter.alpha if adapter else None,
                          seed=spec.sampling.seed, **extra),
        validation_prompts=spec.validation.prompts,
        validation_max_new_tokens=spec.validation.max_new_tokens,
        sampling_draws=spec.validation.sampling_draws,
    )


def drafter_dir(path: str) -> str:
    """A drafter directory, or the drafter/ inside an exported artifact folder (trainer/drafter/checkpoint.py
    `drafter_folder`); a folder holding neither is passed on as given, for loading it to say what is missing."""
    return str(drafter_folder(path) or path)


def _local(reference: str) -> str:
    if reference.startswith("file://"):
        return file_uri_path(reference)
    raise DraftsmithError(f"init.from_drafter {reference!r} is fetched by the service; locally, give a drafter "
                          "directory as file:///path (or submit the job with `draftsmith submit`)")
