"""The one drafter-folder rule (trainer/drafter/checkpoint.py `drafter_folder`, issue 34): a folder that is a drafter
is read itself, else its drafter/, and every reader (the worker, the trainer's warm start, the audit) agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.audit import drafter_directory
from trainer.drafter.checkpoint import drafter_folder, drafter_prefix
from trainer.errors import DraftsmithError
from trainer.job_config import drafter_dir
from worker.drafters import DrafterNotFound, _drafter_dir


def drafter(folder: Path, tag: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(f'{{"tag": "{tag}"}}')
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def readers(path: Path) -> set[str]:
    """Where each reader finds the drafter of `path`."""
    return {str(drafter_folder(path)), drafter_dir(str(path)), str(drafter_directory(path)[0]),
            _drafter_dir(path, str(path))}


def test_a_drafter_directory_is_read_itself(tmp_path):
    drafter(tmp_path / "d")
    assert drafter_folder(tmp_path / "d") == tmp_path / "d"
    assert readers(tmp_path / "d") == {str(tmp_path / "d")}


def test_an_export_folder_is_read_through_its_drafter_folder(tmp_path):
    drafter(tmp_path / "out" / "drafter")
    (tmp_path / "out" / "report.json").write_text("{}")
    (tmp_path / "out" / "README.md").write_text("card")
    assert readers(tmp_path / "out") == {str(tmp_path / "out" / "drafter")}
    assert drafter_directory(tmp_path / "out")[1] == tmp_path / "out" / "report.json"


def test_the_named_folder_wins_over_a_nested_drafter(tmp_path):
    """The audit used to take drafter/ first; the folder the caller named is the drafter it meant."""
    drafter(tmp_path / "d", "outer")
    drafter(tmp_path / "d" / "drafter", "inner")
    assert readers(tmp_path / "d") == {str(tmp_path / "d")}


def test_a_config_without_weights_is_not_a_drafter(tmp_path):
    """The trainer used to take any folder with a config.json (a Hub repo's root, a target's)."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "config.json").write_text("{}")
    drafter(tmp_path / "repo" / "drafter")
    assert readers(tmp_path / "repo") == {str(tmp_path / "repo" / "drafter")}


def test_a_folder_without_a_drafter(tmp_path):
    (tmp_path / "empty" / "drafter").mkdir(parents=True)
    (tmp_path / "empty" / "drafter" / "config.json").write_text("{}")
    assert drafter_folder(tmp_path / "empty") is None
    assert drafter_folder(tmp_path / "missing") is None
    assert drafter_dir(str(tmp_path / "empty")) == str(tmp_path / "empty")  # loading it says what is missing
    with pytest.raises(DraftsmithError, match="is not a drafter"):
        drafter_directory(tmp_path / "empty")
    with pytest.raises(DrafterNotFound):
        _drafter_dir(tmp_path / "empty", "file:///empty")


def test_the_rule_on_listed_names():
    """An S3 listing is judged by the same rule (worker/drafters.py `_from_s3`)."""
    assert drafter_prefix(["config.json", "model.safetensors", "drafter/config.json",
                           "drafter/model.safetensors"]) == ""
    assert drafter_prefix(["config.json", "drafter/config.json", "drafter/model.safetensors"]) == "drafter/"
    assert drafter_prefix(["config.json", "sub/model.safetensors"]) is None
    assert drafter_prefix(["drafter/config.json", "drafter/x/model.safetensors"]) is None
    assert drafter_prefix([]) is None
