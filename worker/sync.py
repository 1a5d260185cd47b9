"""A job's files between this machine and object storage. Storage holds the truth under
`jobs/<job_id>/work/`; the worker's local cache is a copy it can lose at any time.

`pull(paths)` fetches what a stage needs before it runs; `push(path)` (the stage's `on_saved` hook) mirrors
a file or directory after the trainer wrote it durably: new and changed files go up oldest first, so a
marker written last (a data set's COMPLETE, a checkpoint's `latest`) is uploaded last, and remote files
that are gone locally (pruned checkpoints) are deleted. A stage on another machine therefore resumes from
the last checkpoint or shard that reached storage.
"""

from __future__ import annotations

import os
from pathlib import Path
from stat import S_ISREG

from domain.storage import LocalStorage, S3Storage

SMALL_FILE_BYTES = 1 << 20


class WorkSync:
    def __init__(self, storage: LocalStorage | S3Storage, prefix: str, root: Path):
        self.storage, self.prefix, self.root = storage, prefix.rstrip("/"), root
        self._known: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) as last synced

    def _key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"

    def remote(self, under: str = "") -> dict[str, int]:
        """{relative path: size} stored below `under` (all of the job's work files when empty)."""
        prefix = self._key(under).rstrip("/") if under else self.prefix
        return {key[len(self.prefix) + 1:]: size for key, size in self.storage.list_keys(prefix).items()}

    def has(self, relative: str) -> bool:
        return self.storage.exists(self._key(relative))

    def read(self, relative: str) -> bytes | None:
        """One small work file as stored (None: not stored), for a stage that reads another stage's record without
        mirroring the folder (publish, on a worker that may have run nothing else)."""
        key = self._key(relative)
        return b"".join(self.storage.open_chunks(key)) if self.storage.exists(key) else None

    def put_bytes(self, relative: str, data: bytes) -> None:
        """Store a record written nowhere locally (a stage's marker), under the job's work files."""
        self.storage.put_bytes(self._key(relative), data)

    def pull(self, *unders: str) -> None:
        """Download everything stored below each relative path (a file or a directory) that differs locally."""
        for under in unders:
            entries = self.remote(under) if not self.has(under) else {under: None}
            for relative, size in entries.items():
                local = self.root / relative
                # Large files (shards, checkpoint parts) are written once under their name, so equal size means
                # the same file; small ones (markers, `latest`, metrics) change in place and are always fetched.
                if local.is_file() and size is not None and size > SMALL_FILE_BYTES and local.stat().st_size == size:
                    self._remember(relative, local)
                    continue
                self.storage.get_file(self._key(relative), local)
                self._remember(relative, local)

    def push(self, path: Path) -> None:
        """Mirror one file or directory below the root to storage (see the module docstring)."""
        path = Path(path)
        if not path.is_relative_to(self.root):
            return  # not a work file (the export directory is uploaded as registered artifacts instead)
        relative_dir = path.relative_to(self.root).as_posix()
        # The trainer keeps writing (and pruning old checkpoints) while this runs: a file that vanishes between
        # the listing and its upload was pruned, so it is skipped now and deleted remotely below or next time.
        found = []
        for file in (path.rglob("*") if path.is_dir() else [path]):
            if any(part.startswith(".") for part in file.relative_to(self.root).parts):
                continue
            try:
                stat = file.stat()
            except FileNotFoundError:
                continue
            if S_ISREG(stat.st_mode):
                found.append((file, stat))
        present = set()
        for file, stat in sorted(found, key=lambda entry: entry[1].st_mtime_ns):
            relative = file.relative_to(self.root).as_posix()
            if self._known.get(relative) != (stat.st_size, stat.st_mtime_ns):
                try:
                    self.storage.put_file(self._key(relative), file)
                except FileNotFoundError:
                    continue
                self._known[relative] = (stat.st_size, stat.st_mtime_ns)
            present.add(relative)
        if path.is_dir():
            for relative in self.remote(relative_dir):
                if relative not in present:
                    self.storage.delete(self._key(relative))
                    self._known.pop(relative, None)

    def _remember(self, relative: str, local: Path) -> None:
        stat = os.stat(local)
        self._known[relative] = (stat.st_size, stat.st_mtime_ns)


def job_work(storage: LocalStorage | S3Storage, job_id: str, job_dir: Path) -> WorkSync:
    """The job's work files: `jobs/<job_id>/work/` in storage, `<job_dir>/work` on this machine."""
    return WorkSync(storage, f"jobs/{job_id}/work", job_dir / "work")
