"""manifest.json: the sha256 and size of every file of an artifact directory, written last by the export.

Shared by whoever writes a manifest (trainer/export), stores or serves files (api/) and checks a download
(the client), so all agree on what "the same file" means. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(root: Path) -> dict[str, Any]:
    """{"files": {relative path: {"sha256", "bytes"}}} of every file below root but manifest.json and dotfiles."""
    files = {}
    for path in sorted(Path(root).rglob("*")):
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
