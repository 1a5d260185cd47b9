"""drafter-record.json: the drafter's record (schemas/lineage.py `DrafterRecord`), written once by the export.

Its shape comes from the drafter's `DrafterConfig`, its metrics from the validation report (`ValidationReport`,
through `DrafterMetrics.measured`), its serving flags from `ServingSettings.at_block` at `serving_block`, the
block the model card's commands use too (trainer/export/model_card.py). The worker records the published drafter
from this file (worker/drafters.py `record_lineage`) and derives none of it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schemas.lineage import DrafterMetrics, DrafterRecord, RecordedShape, ServingSettings
from schemas.validation_report import ValidationReport
from trainer.atomic import atomic_write_json
from trainer.drafter.config import ARCHITECTURES, DrafterConfig


def serving_block(config: DrafterConfig, report: ValidationReport | None) -> int:
    """The block an engine serves the drafter at: validation's recommended one, else the drafter's own."""
    recommended = report.recommended_block_size if report is not None else None
    return recommended if recommended is not None else config.block_size


def drafter_record(config: DrafterConfig, report: ValidationReport | None) -> DrafterRecord:
    """The record of the drafter `config` describes, validated as `report` says (None: no report was given to the
    export, so no figures but the serving flags at the drafter's own block)."""
    measured = report if report is not None else ValidationReport()
    shape = RecordedShape.written(
        hidden_size=config.hidden_size, vocab_size=config.vocab_size, num_target_layers=config.num_target_layers,
        target_layer_ids=list(config.target_layer_ids), mask_token_id=config.mask_token_id,
        architecture=ARCHITECTURES[config.variant])
    return DrafterRecord.written(
        shape=shape, metrics=DrafterMetrics.measured(measured, ServingSettings.at_block(serving_block(config, report))),
        target_fingerprint=measured.target_fingerprint, warm_start=measured.warm_start)


def write_drafter_record(out_dir: Path, config: DrafterConfig, report: ValidationReport | None) -> DrafterRecord:
    """OUT/drafter-record.json, renamed into place (before the manifest, which lists it)."""
    record = drafter_record(config, report)
    atomic_write_json(Path(out_dir) / DrafterRecord.FILE, record.to_json())
    return record


def record_of_export(drafter_config: Mapping[str, Any], report: Mapping[str, Any] | ValidationReport | None
                     ) -> DrafterRecord:
    """The record an export written before drafter-record.json existed would have written, from the files it did
    write: drafter/config.json (read by `DrafterConfig.from_hf_dict`) and report.json. The same rule as
    `drafter_record`, for the worker's jobs exported by an older release (worker/drafters.py)."""
    return drafter_record(DrafterConfig.from_hf_dict(dict(drafter_config)), ValidationReport.read(report))
