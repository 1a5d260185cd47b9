"""Errors a user can act on. Each message names the problem and the fix in one line.

Every error carries a stable `code` (lowercase, for machines: the job's `error.code`, the CLI's exit
message, alerting rules); subclasses set their own.
"""


class DraftsmithError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""

    code = "invalid_request"


class TargetError(DraftsmithError):
    """The target checkpoint cannot be used as given."""

    code = "target_invalid"


class DrafterError(DraftsmithError):
    """A drafter checkpoint is malformed or does not fit the target."""

    code = "drafter_invalid"


class StageInterrupted(DraftsmithError):
    """A stage stopped early because its caller asked it to (a cancelled job). Its progress is saved:
    generation keeps finished shards, training writes a checkpoint first, so the stage resumes."""

    code = "interrupted"


class CheckpointMismatch(DraftsmithError):
    """A training checkpoint that this run cannot resume: another engine, ZeRO stage, number of processes, dtype or
    drafter adapter wrote it (trainer/training/checkpoint_record.py). The message names what wrote it, what is
    resuming, and the fix: resume as it was written, or start over."""

    code = "checkpoint_mismatch"


# What can be wrong inside a target folder an organisation hands over: each its own code, so a malformed file is
# told apart from a bug (internal_error) by the job's error.code, the CLI and alerting alike.


class TargetBaseRequired(TargetError):
    """A LoRA adapter target without the job's target.base: the adapter's own pointer is never followed."""

    code = "target_base_required"


class TargetConfigInvalid(TargetError):
    code = "target_config_invalid"


class TargetSelfTestFailed(TargetError):
    """The target's own speculative decoding differs from its plain decoding (trainer/targets/self_test.py): a layer
    whose cache does not roll back exactly, named with its kind; refused at prepare, before any compute."""

    code = "target_self_test_failed"


class TargetTooLarge(TargetError):
    """A size in config.json or the weights above the deployment's limits (schemas/bounds.py TargetLimits)."""

    code = "target_too_large"


class TargetShapeMismatch(TargetError):
    """config.json and the safetensors files disagree (shapes, parameter count, the index)."""

    code = "target_shape_mismatch"


class WeightsHeaderInvalid(TargetError):
    """A safetensors header that is not one (a header bomb, not JSON, malformed entries)."""

    code = "weights_header_invalid"


class WeightsShardTruncated(TargetError):
    code = "weights_shard_truncated"


class WeightsDtypeInvalid(TargetError):
    code = "weights_dtype_invalid"


class WeightsTensorDuplicate(TargetError):
    code = "weights_tensor_duplicate"


class TokenizerInvalid(TargetError):
    code = "tokenizer_invalid"


class ChatTemplateInvalid(TargetError):
    code = "chat_template_invalid"
