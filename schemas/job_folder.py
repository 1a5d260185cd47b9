"""Every file a job leaves: its path and its type, in one table.

A job writes two folders. Its work folder (`work/`: `draftsmith run` keeps it in OUT/.work/, the worker mirrors it
to object storage as jobs/<id>/work/) holds what each stage leaves for the stages after it; its export folder
(`out/`) holds the artifacts. Each JSON file in them has one model (schemas/work_files.py's lenient reading, a
`version`), named here beside the file's path relative to its folder:

    work/ sources.json                          PinnedSources     worker/job_files.py, at prepare
          prepare.json                          PreparedTarget    trainer/pipeline.py prepare
          stages/<stage>.json                   StageMarker       worker/stages.py, a finished stage, last
          data/meta.json                        DataMeta          trainer/data/regenerate.py, first
          train/metrics.jsonl                   StepRecord        trainer/training/loop.py, a line a step
          train/checkpoints/<tag>/engine.json   CheckpointRecord  trainer/training/checkpoint_record.py
          train/drafter/config.json             DrafterConfigFile trainer/drafter/checkpoint.py (a Hugging Face config)
          report.json                           ValidationReport  trainer/validation/report.py
    out/  report.json, metrics.jsonl, drafter/config.json         the export's copies, same models
          drafter-record.json                   DrafterRecord     trainer/export/record.py
          manifest.json                         Manifest          trainer/export/artifacts.py, last

Writers and readers take a file's path from here (`SOURCES.path`, `STAGE_MARKER.name(stage=...)`,
`out / MANIFEST.path`) rather than spelling it again. Pure pydantic and stdlib: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import Field

from schemas import work_files
from schemas.lineage import DrafterRecord
from schemas.manifest import Manifest
from schemas.validation_report import ValidationReport
from schemas.work_files import DataMeta, LenientModel, StepRecord

M = TypeVar("M", bound=LenientModel, covariant=True)


class DraftsmithConfig(LenientModel):
    """config.json's `draftsmith` section: what Draftsmith adds to the reference config (trainer/drafter/config.py
    `to_hf_dict`, the export's block size and confidence map), each key only where it is known."""

    target_fingerprint: str | None = None
    draft_vocab_size: int | None = None
    recommended_block_size: int | None = None
    confidence: dict[str, Any] | None = None


class DrafterConfigFile(LenientModel):
    """drafter/config.json as a reader outside the trainer sees it: a Hugging Face config (the reference `dflash`
    package's), kept whole. Not versioned: its shape is the engines', not ours. The trainer parses it into its own
    DrafterConfig (trainer/drafter/config.py `from_hf_dict`); the shape a publish records is drafter-record.json's."""

    architectures: list[str] | None = None
    model_type: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_target_layers: int | None = None
    block_size: int | None = None
    dflash_config: dict[str, Any] | None = Field(default=None, description="block_size, mask_token_id and "
                                                 "target_layer_ids, as the reference package reads them.")
    draftsmith: DraftsmithConfig | None = None


@dataclass(frozen=True)
class JobFile(Generic[M]):
    """One file of a job's folders: where it lies and what reads it."""

    path: str
    """Relative to its folder, POSIX; `{stage}` and `{tag}` are filled by `name`."""
    model: type[M]
    """What reads it: `model.load(path)` for a JSON file, `StepRecord.lines(path)` for metrics.jsonl's lines."""
    folder: Literal["work", "out"]

    def name(self, **parts: str) -> str:
        """The path with its parts filled in (`STAGE_MARKER.name(stage="train")`: stages/train.json)."""
        return self.path.format(**parts)


SOURCES = JobFile("sources.json", work_files.PinnedSources, "work")
PREPARED = JobFile("prepare.json", work_files.PreparedTarget, "work")
STAGE_MARKER = JobFile("stages/{stage}.json", work_files.StageMarker, "work")
DATA_META = JobFile(f"data/{DataMeta.FILE}", DataMeta, "work")
STEP_RECORDS = JobFile(f"train/{StepRecord.FILE}", StepRecord, "work")
CHECKPOINT_RECORD = JobFile(f"train/checkpoints/{{tag}}/{work_files.CheckpointRecord.FILE}", work_files.CheckpointRecord,
                            "work")
DRAFTER_CONFIG = JobFile("train/drafter/config.json", DrafterConfigFile, "work")
REPORT = JobFile("report.json", ValidationReport, "work")

EXPORTED_REPORT = JobFile(REPORT.path, ValidationReport, "out")
EXPORTED_STEP_RECORDS = JobFile(StepRecord.FILE, StepRecord, "out")
EXPORTED_DRAFTER_CONFIG = JobFile("drafter/config.json", DrafterConfigFile, "out")
DRAFTER_RECORD = JobFile(DrafterRecord.FILE, DrafterRecord, "out")
MANIFEST = JobFile(Manifest.FILE, Manifest, "out")

JOB_FILES: tuple[JobFile[LenientModel], ...] = (
    SOURCES, PREPARED, STAGE_MARKER, DATA_META, STEP_RECORDS, CHECKPOINT_RECORD, DRAFTER_CONFIG, REPORT,
    EXPORTED_REPORT, EXPORTED_STEP_RECORDS, EXPORTED_DRAFTER_CONFIG, DRAFTER_RECORD, MANIFEST,
)
"""Every file a job leaves, work folder first."""
