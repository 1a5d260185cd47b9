"""`draftsmith export`: a trained drafter packaged for every serving engine.

    drafter/config.json, drafter/model.safetensors   reference `dflash` format, full head (SGLang, transformers,
                                                     vLLM for DFlash 2 and for drafters without a draft vocabulary)
    gguf/drafter-f16.gguf, gguf/drafter-q8_0.gguf     llama.cpp (`--spec-type draft-dflash`), full head
    drafter-d2t/                                     with a draft vocabulary: the drafter as vLLM reads one
                                                     (trainer/export/drafter_d2t.py; vLLM for DFlash)
    gguf/drafter-q8_0-d2t.gguf                       with a draft vocabulary: its own head + `d2t` (llama.cpp)
    drafter-adapter/                                 a drafter adapter job's PEFT LoRA over its parent (adapter_config.json,
                                                     adapter_model.safetensors; trainer/training/drafter_adapter.py):
                                                     drafter/ is it merged, the one served
    README.md                                        model card: target, sampling, figures, serving commands
    drafter-record.json                              the drafter's record: shape, headline metrics, serving flags
                                                     (trainer/export/record.py; what the worker records at publish)
    report.json, metrics.jsonl                       validation report and per-step training metrics
    report.html                                      both as charts, self-contained (opens from disk)
    manifest.json                                    sha256 and size of every other file

Every file is written under a temporary name and renamed, and the manifest comes last: a directory
without manifest.json is not a finished export.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from report.html import read_metric_records, render_report_html
from schemas.job_folder import EXPORTED_REPORT, EXPORTED_STEP_RECORDS, MANIFEST
from schemas.manifest import Manifest, build_manifest, sha256_file, verify_manifest  # noqa: F401 - re-exported
from schemas.validation_report import TargetDescription, ValidationReport
from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.drafter.checkpoint import load_drafter
from trainer.errors import DraftsmithError, TargetError
from trainer.export.drafter_d2t import D2T_DIR, REFERENCE_DIR, reference_config, write_d2t_drafter
from trainer.export.gguf_writer import write_gguf
from trainer.export.model_card import D2T_GGUF, model_card
from trainer.export.record import write_drafter_record
from trainer.targets.families import UNLISTED_GGUF
from trainer.targets.loading import Target
from trainer.validation.report import check_compatible

GGUF_TYPES = ("f16", "q8_0")
NO_GGUF_WRITER = ("the GGUF writer does not export this family's vocabulary: convert `drafter/` with llama.cpp's "
                  "convert_hf_to_gguf.py --target-model-dir TARGET")


def export_artifacts(drafter_dir: str | Path, target: Target, out_dir: str | Path, *,
                     report: ValidationReport | Mapping | None = None, metrics_file: str | Path | None = None,
                     names: TargetDescription | None = None) -> Manifest:
    """Write the artifact layout into out_dir; return the manifest. `report`: the validation report (the model, or
    report.json's object); `names`: the target as the job named it (`Target.describe`; default its folders)."""
    report = None if report is None else ValidationReport.read(report)
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    if target.path is None or not (target.path / "config.json").is_file():
        raise DraftsmithError(f"the target directory {target.path} is missing; export needs it for the tokenizer "
                              "(GGUF) and the compatibility check")
    drafter = load_drafter(drafter_dir)
    check_compatible(target, drafter)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST.path).unlink(missing_ok=True)  # the directory is unfinished until it is rewritten

    confidence = report.confidence.map if report is not None and report.confidence is not None else None
    no_gguf = write_engine_drafters(drafter_dir, drafter.draft_vocab, target, out_dir,
                                    recommended_block_size=report.recommended_block_size if report else None,
                                    confidence=None if confidence is None else confidence.to_json())
    ship_adapter(drafter_dir, out_dir, report)
    if report is not None:
        atomic_write_json(out_dir / EXPORTED_REPORT.path, report.to_json())
    if metrics_file is not None and Path(metrics_file).is_file():
        _atomic_copy(Path(metrics_file), out_dir / EXPORTED_STEP_RECORDS.path)
    names = names or target.describe()
    card = model_card(drafter.config, target, report, names, no_gguf=no_gguf)
    atomic_write_bytes(out_dir / "README.md", card.encode())
    write_drafter_record(out_dir, drafter.config, report)
    write_report_html(out_dir, report, metrics_file, title=f"Draftsmith drafter for {names.name}")
    manifest = build_manifest(out_dir)
    atomic_write_json(out_dir / MANIFEST.path, manifest.to_json())
    return manifest


def ship_adapter(drafter_dir: Path, out_dir: Path, report: ValidationReport | None) -> None:
    """A drafter adapter trained beside `drafter_dir` into OUT/drafter-adapter/, its base named as the job names the
    parent (report.json `warm_start.parent.name`); none: nothing left from an earlier export into the same folder."""
    from trainer.training.drafter_adapter import ADAPTER_DIR, adapter_folder, copy_adapter, name_the_base

    source = adapter_folder(drafter_dir)
    if source is None:
        shutil.rmtree(out_dir / ADAPTER_DIR, ignore_errors=True)
        return
    warm_start = report.warm_start if report is not None else None
    parent = warm_start.parent if warm_start is not None else None
    base_name = parent.name if parent is not None else None
    if source.resolve() == (out_dir / ADAPTER_DIR).resolve():  # an export's own drafter/ exported again in place
        name_the_base(source, base_name)
    else:
        copy_adapter(source, out_dir / ADAPTER_DIR, base_name)


def write_report_html(out_dir: str | Path, report: ValidationReport | Mapping | None,
                      metrics_file: str | Path | None, *, title: str = "Draftsmith drafter report") -> Path:
    """Write OUT/report.html (report/html.py renders it) atomically and return its path."""
    path = Path(out_dir) / "report.html"
    page = render_report_html(report, read_metric_records(metrics_file), title=title)
    atomic_write_bytes(path, page.encode("utf-8"))
    return path


def write_engine_drafters(drafter_dir: Path, draft_vocab, target: Target, out_dir: Path, *,
                          recommended_block_size: int | None = None, ggufs: tuple[str, ...] = GGUF_TYPES,
                          confidence: dict | None = None) -> str | None:
    """The drafter folders and GGUFs the engines load (also what validation's engine step runs,
    trainer/validation/engines.py): drafter/, gguf/drafter-{ggufs}.gguf and, with a draft vocabulary,
    drafter-d2t/ and (when q8_0 is among `ggufs`) the d2t GGUF. Returns why no GGUF was written (the target's
    vocabulary is not one the GGUF writer exports), else None: the other engines' files ship either way."""
    config = json.loads((Path(drafter_dir) / "config.json").read_text())
    if recommended_block_size:
        # `draftsmith decode` (and anyone reading config.json) then drafts at the length validation measured best.
        config.setdefault("draftsmith", {})["recommended_block_size"] = recommended_block_size
    if confidence:
        # No engine reads a calibrated map (docs/CONFIDENCE.md): it ships under our own key, for our decoder and
        # for anyone sizing verification from the drafter's score.
        config.setdefault("draftsmith", {})["confidence"] = confidence
    staged = out_dir / REFERENCE_DIR
    staged.mkdir(parents=True, exist_ok=True)
    _reference_weights(Path(drafter_dir) / "model.safetensors", staged / "model.safetensors")
    atomic_write_json(staged / "config.json", reference_config(config))
    no_gguf = None if target.family["gguf"] else NO_GGUF_WRITER if target.family["engines"] else UNLISTED_GGUF
    if no_gguf is None:
        (out_dir / "gguf").mkdir(exist_ok=True)
        try:
            for dtype in ggufs:
                write_gguf(staged, target.path, out_dir / "gguf" / f"drafter-{dtype}.gguf", dtype)
        except TargetError as exc:  # e.g. a BPE pre-tokenizer llama.cpp does not know: the target's, not ours
            no_gguf = str(exc)
    if no_gguf is not None:
        ggufs = ()
        shutil.rmtree(out_dir / "gguf", ignore_errors=True)
    if draft_vocab is not None:
        # Engines that read a draft vocabulary (vLLM, llama.cpp: `d2t`) draft over it; drafter/ and the GGUFs
        # above keep the full head for those that do not (SGLang, the reference package).
        write_d2t_drafter(config, staged / "model.safetensors", out_dir / D2T_DIR, draft_vocab, target.lm_head.weight)
        if "q8_0" in ggufs:
            write_gguf(staged, target.path, out_dir / D2T_GGUF, "q8_0", draft_vocab=(draft_vocab, target.lm_head.weight))
    else:  # nothing left from an earlier export of another drafter into the same folder
        shutil.rmtree(out_dir / D2T_DIR, ignore_errors=True)
        (out_dir / D2T_GGUF).unlink(missing_ok=True)
    return no_gguf


def _reference_weights(source: Path, destination: Path) -> None:
    """model.safetensors of drafter/: the drafter's weights only (a drafter-d2t/ source loses its d2t and head)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    if not source.is_file():
        raise DraftsmithError(f"{source} is missing")
    with safe_open(str(source), "pt") as weights:
        names = set(weights.keys())
    if "d2t" not in names:
        _atomic_copy(source, destination)
        return
    tensors = {k: v for k, v in load_file(str(source)).items() if k not in ("d2t", "t2d", "lm_head.weight")}
    with atomic_path(destination) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})


def _atomic_copy(source: Path, destination: Path) -> None:
    if not source.is_file():
        raise DraftsmithError(f"{source} is missing")
    with atomic_path(destination) as tmp:
        shutil.copyfile(source, tmp)
