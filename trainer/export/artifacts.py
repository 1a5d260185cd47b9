"""`draftsmith export`: a trained drafter packaged for every serving engine.

    drafter/config.json, drafter/model.safetensors   reference `dflash` format (SGLang, vLLM, transformers)
    gguf/drafter-f16.gguf, gguf/drafter-q8_0.gguf     llama.cpp (`--spec-type draft-dflash`)
    drafter/draft_vocab.safetensors,                 with a draft vocabulary: d2t/t2d (EAGLE-3 convention) and a
      gguf/drafter-q8_0-d2t.gguf                     GGUF whose own head covers it (llama.cpp's DFlash `d2t`)
    README.md                                        model card: target, sampling, figures, serving commands
    report.json, metrics.jsonl                       validation report and per-step training metrics
    report.html                                      both as charts, self-contained (opens from disk)
    manifest.json                                    sha256 and size of every other file

Every file is written under a temporary name and renamed, and the manifest comes last: a directory
without manifest.json is not a finished export.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from schemas.manifest import build_manifest, sha256_file, verify_manifest  # noqa: F401 - re-exported
from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.drafter.checkpoint import load_drafter
from trainer.drafter.draft_vocab import FILE_NAME as DRAFT_VOCAB_FILE
from trainer.errors import DraftsmithError
from trainer.export.gguf_writer import write_gguf
from trainer.export.model_card import D2T_GGUF, model_card
from trainer.export.report_html import write_report_html
from trainer.targets.loading import Target
from trainer.validation.report import check_compatible

GGUF_TYPES = ("f16", "q8_0")


def export_artifacts(drafter_dir: str | Path, target: Target, out_dir: str | Path, *, report: dict | None = None,
                     metrics_file: str | Path | None = None, target_name: str | None = None) -> dict:
    """Write the artifact layout into out_dir; return the manifest."""
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    if target.path is None or not (target.path / "config.json").is_file():
        raise DraftsmithError(f"the target directory {target.path} is missing; export needs it for the tokenizer "
                              "(GGUF) and the compatibility check")
    drafter = load_drafter(drafter_dir)
    check_compatible(target, drafter)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)  # the directory is unfinished until it is rewritten

    staged = out_dir / "drafter"
    staged.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        _atomic_copy(drafter_dir / name, staged / name)
    if report and report.get("recommended_block_size"):
        # `draftsmith decode` (and anyone reading config.json) then drafts at the length validation measured best.
        config = json.loads((staged / "config.json").read_text())
        config.setdefault("draftsmith", {})["recommended_block_size"] = report["recommended_block_size"]
        atomic_write_json(staged / "config.json", config)
    (out_dir / "gguf").mkdir(exist_ok=True)
    for dtype in GGUF_TYPES:
        write_gguf(staged, target.path, out_dir / "gguf" / f"drafter-{dtype}.gguf", dtype)
    if drafter.draft_vocab is not None:
        # Engines that read a draft vocabulary (vLLM, llama.cpp: `d2t`) draft over it; the files above keep the
        # full head for those that do not (SGLang, the reference package).
        _atomic_copy(drafter_dir / DRAFT_VOCAB_FILE, staged / DRAFT_VOCAB_FILE)
        write_gguf(staged, target.path, out_dir / D2T_GGUF, "q8_0",
                   draft_vocab=(drafter.draft_vocab, target.lm_head.weight))
    if report is not None:
        atomic_write_json(out_dir / "report.json", report)
    if metrics_file is not None and Path(metrics_file).is_file():
        _atomic_copy(Path(metrics_file), out_dir / "metrics.jsonl")
    card = model_card(drafter.config, target, report, target_name or str(target.path))
    atomic_write_bytes(out_dir / "README.md", card.encode())
    write_report_html(out_dir, report, metrics_file, title=f"Draftsmith drafter for {target_name or target.path}")
    manifest = build_manifest(out_dir)
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def _atomic_copy(source: Path, destination: Path) -> None:
    if not source.is_file():
        raise DraftsmithError(f"{source} is missing")
    with atomic_path(destination) as tmp:
        shutil.copyfile(source, tmp)
