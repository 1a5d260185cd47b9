"""`draftsmith export`: a trained drafter packaged for every serving engine.

    drafter/config.json, drafter/model.safetensors   reference `dflash` format (SGLang, vLLM, transformers)
    gguf/drafter-f16.gguf, gguf/drafter-q8_0.gguf     llama.cpp (`--spec-type draft-dflash`)
    README.md                                        model card: target, sampling, figures, serving commands
    report.json, metrics.jsonl                       validation report and per-step training metrics
    manifest.json                                    sha256 and size of every other file

Every file is written under a temporary name and renamed, and the manifest comes last: a directory
without manifest.json is not a finished export.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.drafter.checkpoint import load_drafter
from trainer.errors import DraftsmithError
from trainer.export.gguf_writer import write_gguf
from trainer.export.model_card import model_card
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
    (out_dir / "gguf").mkdir(exist_ok=True)
    for dtype in GGUF_TYPES:
        write_gguf(staged, target.path, out_dir / "gguf" / f"drafter-{dtype}.gguf", dtype)
    if report is not None:
        atomic_write_json(out_dir / "report.json", report)
    if metrics_file is not None and Path(metrics_file).is_file():
        _atomic_copy(Path(metrics_file), out_dir / "metrics.jsonl")
    card = model_card(drafter.config, target, report, target_name or str(target.path))
    atomic_write_bytes(out_dir / "README.md", card.encode())
    manifest = build_manifest(out_dir)
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def build_manifest(root: Path) -> dict:
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or relative == "manifest.json" or relative.startswith(".") or "/." in relative:
            continue
        files[relative] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return {"files": files}


def verify_manifest(root: str | Path) -> list[str]:
    """Problems found (empty when every listed file is present with its size and hash)."""
    root = Path(root)
    manifest = json.loads((root / "manifest.json").read_text())
    problems = []
    for relative, entry in manifest["files"].items():
        path = root / relative
        if not path.is_file():
            problems.append(f"{relative}: missing")
        elif path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            problems.append(f"{relative}: content differs from the manifest")
    return problems


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_copy(source: Path, destination: Path) -> None:
    if not source.is_file():
        raise DraftsmithError(f"{source} is missing")
    with atomic_path(destination) as tmp:
        shutil.copyfile(source, tmp)
