"""Files that appear whole or not at all: write to a hidden sibling, then rename over the target.

A crash (or a failed write) never leaves a half-written file under the real name, so anything that finds
a file may trust it — resumable runs rely on that to tell finished work from unfinished.

The one write-then-rename helper, with one fsync policy: the written file (a directory: every file
in it, then the directory itself) is fsynced before the rename, and the parent directory after it. The first
keeps a power cut from leaving the new name on empty or partial data (the rename can reach the disk before the
data does); the second makes the rename itself durable, so a file reported written is still there after a
crash. tests/test_layout.py bans `os.replace`/`os.rename`/`Path.rename`/`Path.replace` elsewhere in product code,
except domain/storage.py: the storage backend streams and hashes an upload while writing it, and the domain may
not import the trainer, so it keeps its own writer under the same policy.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of `path` for the block to write (a file, or a directory it creates and fills),
    unique to this call; fsynced and renamed onto `path` if the block finishes, removed if not."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        fsync_tree(tmp)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2) + "\n").encode())


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file below a directory and then the directories, deepest first."""
    if path.is_dir() and not path.is_symlink():
        for folder, _, files in os.walk(path, topdown=False):
            for name in files:
                file = Path(folder) / name
                if not file.is_symlink():
                    _fsync(file)
            fsync_directory(Path(folder))
    else:
        _fsync(path)


def fsync_directory(path: Path) -> None:
    """Make the entries of a directory (a rename into it) durable. A filesystem that cannot fsync a directory
    (EINVAL: some network and FUSE filesystems) has no better way to offer, and is let be."""
    try:
        _fsync(path)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def work_lock(path: str | Path) -> Iterator[None]:
    """One process at a time past this point for `path` (a cache several processes fill: test workers side by side,
    worker processes on one node, bench runs on one folder). The lock is a sibling `<name>.lock` file held with
    flock, released by the kernel if the holder dies, so a killed process never leaves it locked."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
