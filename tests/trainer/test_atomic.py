"""trainer/atomic.py: the one write-then-rename helper and its fsync policy (issue 34)."""

from __future__ import annotations

import os

import pytest

from trainer import atomic
from trainer.atomic import atomic_path, atomic_write_bytes


@pytest.fixture
def fsynced(monkeypatch):
    """The paths fsynced, in order, and when the rename happened among them."""
    events: list[str] = []
    real_open, real_replace = os.open, os.replace
    opened: dict[int, str] = {}

    def open_(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = os.path.basename(os.fspath(path))
        return fd

    monkeypatch.setattr(atomic.os, "open", open_)
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: events.append(f"fsync {opened[fd]}"))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("rename"), real_replace(a, b)))
    return events


def test_the_file_is_fsynced_before_the_rename_and_its_directory_after(tmp_path, fsynced):
    atomic_write_bytes(tmp_path / "out.json", b"{}")
    assert (tmp_path / "out.json").read_bytes() == b"{}"
    assert fsynced[0].startswith("fsync .out.json.tmp-") and fsynced[1:] == ["rename", f"fsync {tmp_path.name}"]
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_directory_is_fsynced_file_by_file_then_renamed(tmp_path, fsynced):
    with atomic_path(tmp_path / "target") as staged:
        (staged / "sub").mkdir(parents=True)
        (staged / "sub" / "a").write_text("a")
        (staged / "b").write_text("b")
    assert (tmp_path / "target" / "sub" / "a").read_text() == "a"
    assert fsynced.index("fsync a") < fsynced.index("rename") and fsynced.index("fsync b") < fsynced.index("rename")
    assert fsynced[-1] == f"fsync {tmp_path.name}"


def test_a_failed_block_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "target") as staged:
            staged.mkdir()
            (staged / "half").write_text("x")
            raise RuntimeError("crash")
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "file") as staged:
            staged.write_text("half")
            raise RuntimeError("crash")
    assert os.listdir(tmp_path) == []


def _fill_once(cache: str) -> None:
    """What a cache filler does: check for the finished file, else take time to write it (and count the writes)."""
    import time
    from pathlib import Path

    from trainer.atomic import work_lock

    done = Path(cache) / "done"
    with work_lock(done):
        if not done.exists():
            time.sleep(0.3)
            with open(Path(cache) / "writes", "a") as log:
                log.write("x")
            atomic_write_bytes(done, b"ok")


def test_processes_filling_one_cache_write_it_once(tmp_path):
    """Two processes (parallel test workers, workers on one node) asking for one missing cache entry at once: one
    writes it, the other waits for the lock and finds it written."""
    import multiprocessing

    processes = [multiprocessing.get_context("fork").Process(target=_fill_once, args=(str(tmp_path),))
                 for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=30)
    assert [p.exitcode for p in processes] == [0, 0]
    assert (tmp_path / "writes").read_text() == "x" and (tmp_path / "done").read_bytes() == b"ok"
