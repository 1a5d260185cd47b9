"""A job's JSON work files, typed: what each stage leaves in `jobs/<id>/work/` for the stages after it, the worker
that records the drafter's lineage at publish, and a rerun on another machine.

    sources.json        PinnedSources   what prepare pinned: the exact target, prompts, base and parent revisions
                                        (worker/job_files.py writes it; every later stage fetches those)
    prepare.json        PreparedTarget  what prepare decided: fingerprint, mask token, taps, prompt counts
                                        (trainer/pipeline.py writes it; generate, train and lineage read it)
    stages/<stage>.json StageMarker     a finished stage's summary, stored last (worker/stages.py): a stage whose
                                        marker exists is not run again, and lineage reads generate's and train's
    report.json         ValidationReport (schemas/validation_report.py), on the same base
    data/meta.json      DataMeta        what produced the regenerated data (trainer/data/regenerate.py writes it)
    train/metrics.jsonl StepRecord      one line per training step (trainer/training/loop.py appends it)
    train/checkpoints/<tag>/engine.json
                        CheckpointRecord what wrote a training checkpoint: the engine and what a resume must match
                                        (trainer/training/checkpoint_record.py writes it and checks it on resume)

One rule for all of them, the rule report.json always had (`LenientModel`): every field is optional but for
what its writer always writes (required, so a file without it is an error and a writer that leaves it out is a
bug: DataMeta's, StepRecord's, CheckpointRecord.engine, schemas/manifest.py's), keys a model does not know are kept (a newer writer's additions survive a round trip), and `read` drops a top-level field
whose value does not fit its type instead of failing, so a worker of one release reads the files of another.
Writing is exact: `to_json()` gives back the fields that were set, so a file keeps the keys it had before the
model plus `version`.

Versions. `version` is each model's VERSION in every file written since these models exist (`written` sets it).
A file without it was written before and is read as version 1, which is the shape the code wrote then. A change
that renames or reshapes a field bumps that model's VERSION and says here how the older shape is read.
Pure pydantic: no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class LenientModel(BaseModel):
    """A JSON object read leniently (module docstring): unknown keys kept, misfitting top-level fields dropped."""

    model_config = ConfigDict(extra="allow")

    def to_json(self) -> dict[str, Any]:
        """The object as its file holds it: the fields that were set, in JSON types."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def read(cls, data: Mapping[str, Any] | Self | None) -> Self:
        """The model of a decoded JSON object (None, or anything not an object: an empty one), dropping any
        top-level field whose value does not fit its type rather than failing."""
        if isinstance(data, cls):
            return data
        fields = dict(data) if isinstance(data, Mapping) else {}
        while True:
            try:
                return cls.model_validate(fields)
            except ValidationError as error:
                bad = {e["loc"][0] for e in error.errors() if e["loc"] and e["loc"][0] in fields}
                if not bad:  # a rule over several fields, not one misfit: nothing to drop
                    raise
                for name in bad:
                    del fields[name]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """A JSON file, read leniently."""
        return cls.read(json.loads(Path(path).read_text()))


class VersionedFile(LenientModel):
    """A work file with a shape version: absent reads as 1 (module docstring)."""

    VERSION: ClassVar[int] = 1
    """The shape written now."""

    version: int = Field(default=1, description="The file's shape; absent: 1 (written before it had one).")

    @classmethod
    def written(cls, **fields: Any) -> Self:
        """A new file's content at today's shape. Strict, unlike `read`: a writer's misfit is a bug to see."""
        return cls.model_validate({**fields, "version": cls.VERSION})


# --- sources.json -------------------------------------------------------------------------------------------


class PinnedSource(LenientModel):
    """One input as the job named it and as prepare fetched it."""

    uri: str | None = Field(default=None, description="As the job spec gave it.")
    revision: str | None = Field(default=None, description="What was fetched: a Hub commit, an S3 digest.")
    pinned_uri: str | None = Field(default=None, description="The URI later stages fetch: the same revision.")


class PinnedSources(VersionedFile):
    """sources.json: prepare's pins, so a Hub branch that moves mid-job cannot change a later stage's inputs."""

    target: PinnedSource | None = None
    prompts: PinnedSource | None = None
    base: PinnedSource | None = Field(default=None, description="An adapter target's base model.")
    init: PinnedSource | None = Field(default=None, description="A warm start's parent drafter.")


# --- prepare.json -------------------------------------------------------------------------------------------


class ParentOrigin(LenientModel):
    """Where a warm start's parent drafter came from, as the importer recognised it by its content
    (trainer/drafter/formats.py), and what starting this job from it changed: for the report and the model card."""

    format: str | None = Field(default=None, description="draftsmith, z-lab (the reference dflash format), "
                                                         "speculators or specforge.")
    variant: str | None = Field(default=None, description="The parent's own method: dflash, dflash2 or dspark.")
    architecture: str | None = Field(default=None, description="The architecture its config.json names.")
    upgrades: list[str] = Field(default_factory=list, description="What the job changed, e.g. DFlash to DFlash 2.")
    dropped_tensors: list[str] = Field(default_factory=list,
                                       description="Parent tensors not carried over, each with the reason.")
    notes: list[str] = Field(default_factory=list, description="What a reader of the report should know.")


class PreparedParent(LenientModel):
    """A warm start's parent drafter as prepare checked it."""

    path: str | None = None
    target_fingerprint: str | None = None
    origin: ParentOrigin | None = None


class TargetSelfTest(LenientModel):
    """The self-test at prepare (trainer/targets/self_test.py): speculative decoding with arbitrary drafts against
    the target alone, on the job's own checkpoint; a failure stops the job before any compute."""

    passed: bool | None = None
    failure: str | None = Field(default=None, description="What failed: the layer, its kind and what differed.")
    layer: int | None = Field(default=None, description="The cache layer whose rollback failed, if one did.")
    layer_kind: str | None = None
    tokens: int | None = Field(default=None, description="Greedy tokens compared.")
    block_size: int | None = None
    cycles: int | None = Field(default=None, description="Verifies of the speculative decode.")
    drafts_rejected: int | None = Field(default=None, description="Drafts rejected (each a rollback tested).")
    logit_drift: float | None = Field(default=None, description="The verifies' largest difference from the "
                                      "one-token decode's logits for the same prefixes, over the logits' spread.")
    seed: int | None = None
    dtype: str | None = None
    reference: str | None = Field(default=None, description="The target alone's decode compared against.")
    near_tie: dict[str, Any] | None = Field(default=None, description="Outside float32: where the outputs first "
                                            "differed by a rounding tie (validation's rule), not a failure.")
    layer_kinds: dict[str, int] | None = Field(default=None, description="Decoder layers per kind, read from "
                                               "the model (trainer/targets/contract.py).")
    rollback_by_kind: dict[str, str] | None = Field(default=None, description="Each kind's rollback: crop, "
                                                    "replay (snapshot and replay) or none (no cache).")
    rollback: str | None = None
    seconds: float | None = None


class PreparedTarget(VersionedFile):
    """prepare.json: what prepare decided about the target and the drafter's shape."""

    target_path: str | None = Field(default=None, description="Where the preparing machine had the target.")
    fingerprint: str | None = Field(default=None, description="Tokenizer + embedding fingerprint of the target.")
    adapter_path: str | None = None
    mask_token_id: int | None = None
    mask_token_rule: str | None = Field(default=None, description="Why this mask token: given, or the rule's reason.")
    tap_layer_ids: list[int] | None = Field(default=None, description="The target layers the drafter reads.")
    train_prompts: int | None = None
    holdout_prompts: int | None = None
    parent_drafter: PreparedParent | None = None
    self_test: TargetSelfTest | None = Field(default=None, description="The target's self-test at prepare.")


# --- data/meta.json ----------------------------------------------------------------------------------------


class DataMeta(VersionedFile):
    """data/meta.json: what produced a regenerated data set (trainer/data/regenerate.py writes it first; the data
    store, training and the bench read it). Every field the writer always writes is required: a data set whose
    meta.json lacks one cannot be resumed or trained from safely, so reading it is an error, not a guess."""

    FILE: ClassVar[str] = "meta.json"
    """Its name in the data folder."""
    IDENTITY: ClassVar[tuple[str, ...]] = ("target_fingerprint", "sampling", "tap_layer_ids", "hidden_cached",
                                           "shard_size", "prompt_ids")
    """The fields that must agree for a resumed generate to continue an existing data folder."""

    target_fingerprint: str = Field(description="The target's tokenizer + embedding fingerprint.")
    sampling: dict[str, Any] = Field(description="The SamplingParams the target answered at.")
    tap_layer_ids: list[int] = Field(description="The target layers whose hidden states the data holds.")
    hidden_cached: bool = Field(description="Hidden states stored with the data; False: recomputed in training.")
    hidden_dtype: str | None = None
    shard_size: int
    prompt_ids: list[str] = Field(description="Every prompt answered, in order.")
    plan: str | None = Field(default=None, description="The regeneration plan in words (its cache decision).")
    teacher_top_k: int | None = Field(default=None, description="Logits kept per token of the target's teacher "
                                      "signal; absent: none kept.")

    def differs_from(self, other: DataMeta) -> list[str]:
        """The identity fields on which `other` differs."""
        return [name for name in self.IDENTITY if getattr(self, name) != getattr(other, name)]


# --- train/metrics.jsonl -----------------------------------------------------------------------------------


class StepRecord(VersionedFile):
    """One line of train/metrics.jsonl: a training step as rank 0 appends it (trainer/training/loop.py), tailed by
    the launcher of a multi-process run, replayed into a resumed worker stage's metric series, drawn by report.html.
    The fields every step writes are required; `budget_s` comes with a time budget, the selector's with DFlash 2.

    Version 2 (written now) always writes `grad_norm` (None when the engine reports none) and `progress`; a line
    without a version (version 1) was written before either existed, and reads with both None."""

    VERSION: ClassVar[int] = 2
    FILE: ClassVar[str] = "metrics.jsonl"
    """Its name in the training folder (and among the exported artifacts)."""

    step: int
    loss: float
    ce: float
    lr: float
    grad_norm: float | None = None
    accuracy_per_position: list[float]
    train_tau_estimate: float
    tokens_per_s: float
    epoch: float
    elapsed_s: float
    progress: float | None = Field(default=None, description="The schedule's progress: steps or time budget, "
                                   "whichever ends first.")
    budget_s: float | None = None
    selector_ce: float | None = None
    topk_recall: float | None = None

    @model_validator(mode="after")
    def _version_2_has_its_fields(self) -> StepRecord:
        missing = {"grad_norm", "progress"} - self.model_fields_set
        if self.version >= 2 and missing:
            raise ValueError(f"a version-2 step record writes {', '.join(sorted(missing))}")
        return self

    def values(self) -> dict[str, Any]:
        """The step as its callbacks get it: the line's fields without the file's `version`."""
        return {k: v for k, v in self.to_json().items() if k != "version"}

    @classmethod
    def lines(cls, path: str | os.PathLike[str]) -> list[StepRecord]:
        """Every whole record of a metrics.jsonl (none when it is absent): a line still being written, or torn by
        an interrupted run, is skipped, so a reader sees the steps that were finished."""
        records = []
        for line in (Path(path).read_text().splitlines() if Path(path).is_file() else []):
            try:
                records.append(cls.read(json.loads(line)))
            except ValueError:  # not JSON yet, or a record without its step's fields
                continue
        return records


# --- stages/<stage>.json ------------------------------------------------------------------------------------


class CodeEnvironment(LenientModel):
    """The code that trained a drafter (trainer/lineage.py `environment`)."""

    draftsmith: str | None = None
    git_commit: str | None = None
    python: str | None = None
    platform: str | None = None
    device: str | None = None
    packages: dict[str, str | None] | None = None


class StageMarker(VersionedFile):
    """A finished stage's summary (trainer/pipeline.py `run_stage`'s, plus what the worker adds). Each stage has
    its own keys, kept as they are; the fields here are the ones read back (the drafter's lineage)."""

    examples: int | None = Field(default=None, description="generate: training examples written.")
    response_tokens: int | None = Field(default=None, description="generate: response tokens written.")
    steps: int | None = Field(default=None, description="train: the last step.")
    final_loss: float | None = None
    train_tau_estimate: float | None = None
    environment: CodeEnvironment | None = Field(default=None, description="train: the code that ran it.")

    def summary(self) -> dict[str, Any]:
        """The stage's summary as the stage returned it (without the file's `version`)."""
        return {k: v for k, v in self.to_json().items() if k != "version"}


class CheckpointRecord(VersionedFile):
    """What wrote one training checkpoint, and what a run resuming it must match to continue it correctly: the
    engine (the plain torch engine of an fp32 world of one, or DeepSpeed ZeRO), its ZeRO stage, the number of
    processes (ZeRO shards the optimizer state by rank, and each rank's share of the data follows the world size),
    the weights' dtype, and the drafter adapter trained (its LoRA weights are in the state). `engine` is required:
    every writer writes it. The other fields are always written too (None: not that engine's, or no adapter); a
    record inferred from an older checkpoint's files sets only what the files tell
    (trainer/training/checkpoint_record.py), and resume checks only the fields set."""

    FILE: ClassVar[str] = "engine.json"
    """Its name in the checkpoint's folder."""

    engine: str = Field(description="plain (trainer/training/local_engine.py) or deepspeed.")
    zero_stage: int | None = Field(default=None, description="DeepSpeed's ZeRO stage; None for the plain engine.")
    world_size: int | None = Field(default=None, description="Processes that trained (DeepSpeed's ranks).")
    dtype: str | None = Field(default=None, description="The weights' torch dtype: float32 or bfloat16.")
    drafter_adapter_rank: int | None = Field(default=None, description="The drafter adapter's LoRA rank; None: "
                                             "every weight trained.")
    drafter_adapter_alpha: int | None = None
    step: int | None = Field(default=None, description="The optimizer steps the checkpoint holds.")
