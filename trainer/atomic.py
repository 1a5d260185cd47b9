"""Files that appear whole or not at all: write to a hidden sibling, then rename over the target.

A crash (or a failed write) never leaves a half-written file under the real name, so anything that finds
a file may trust it — resumable runs rely on that to tell finished work from unfinished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of `path` to write; renamed onto `path` if the block finishes, removed if not."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2) + "\n").encode())
