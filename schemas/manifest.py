"""manifest.json: the sha256 and size of every file of an artifact directory, written last by the export.

    {"version": 1, "files": {"drafter/config.json": {"sha256": "9f2c...", "bytes": 1234}, ...}}

Shared by whoever writes a manifest (trainer/export), stores or serves files (api/, the worker's publish) and
checks a download (the client), so all agree on what "the same file" means. Typed like the work files
(schemas/work_files.py `VersionedFile`): `files` and each entry's `sha256` and `bytes` are required, since the
writer always writes them and a check without them checks nothing; a manifest written before it had a `version`
is read as version 1, the shape it has always had.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from schemas.work_files import VersionedFile

CHUNK_BYTES = 1 << 20


class FileEntry(BaseModel):
    """One listed file: its content's sha256 (hex) and its size."""

    model_config = ConfigDict(extra="allow")

    sha256: str
    bytes: int


class Manifest(VersionedFile):
    """manifest.json (module docstring)."""

    FILE: ClassVar[str] = "manifest.json"
    """Its name in the artifact directory, beside the files it lists."""

    files: dict[str, FileEntry]
    """Every file of the directory by its path relative to it (POSIX), but manifest.json and dotfiles."""

    def names(self) -> list[str]:
        """Every file the directory holds, in upload order: the listed files, then manifest.json itself (a listed
        manifest means a complete set)."""
        return [*self.files, self.FILE]


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(root: str | os.PathLike[str]) -> Manifest:
    """The manifest of every file below root but manifest.json and dotfiles."""
    root = Path(root)
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or relative == Manifest.FILE or relative.startswith(".") or "/." in relative:
            continue
        files[relative] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
    return Manifest.written(files=files)


def verify_manifest(root: str | Path) -> list[str]:
    """Problems found (empty when every listed file is present with its size and hash). A manifest.json that is not
    a manifest raises pydantic's ValidationError (a ValueError)."""
    root = Path(root)
    manifest = Manifest.load(root / Manifest.FILE)
    problems = []
    for relative, entry in manifest.files.items():
        path = root / relative
        if not path.is_file():
            problems.append(f"{relative}: missing")
        elif path.stat().st_size != entry.bytes or sha256_file(path) != entry.sha256:
            problems.append(f"{relative}: content differs from the manifest")
    return problems
