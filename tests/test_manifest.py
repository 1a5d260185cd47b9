"""manifest.json's model (schemas/manifest.py): the export's manifest lists every file with its sha256 and size and a
`version`; a manifest written before it had one still checks a download; one that lacks what a check needs is an
error, not a silent pass."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from schemas.manifest import FileEntry, Manifest, build_manifest, sha256_file, verify_manifest


def _folder(tmp_path):
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text('{"a": 1}')
    (tmp_path / "README.md").write_text("card")
    (tmp_path / ".partial").write_text("a temporary file")
    return tmp_path


def test_the_manifest_lists_every_file_but_itself_and_dotfiles_and_checks_them(tmp_path):
    folder = _folder(tmp_path)
    manifest = build_manifest(folder)
    (folder / Manifest.FILE).write_text(json.dumps(manifest.to_json()))
    stored = json.loads((folder / "manifest.json").read_text())
    assert stored == {"version": Manifest.VERSION, "files": {
        "README.md": {"sha256": sha256_file(folder / "README.md"), "bytes": 4},
        "drafter/config.json": {"sha256": sha256_file(folder / "drafter" / "config.json"), "bytes": 8}}}
    assert Manifest.load(folder / "manifest.json").names() == ["README.md", "drafter/config.json", "manifest.json"]
    assert verify_manifest(folder) == []
    (folder / "README.md").write_text("edit")
    (folder / "drafter" / "config.json").unlink()
    assert verify_manifest(folder) == ["README.md: content differs from the manifest", "drafter/config.json: missing"]


def test_a_manifest_written_before_its_version_still_checks_a_download(tmp_path):
    folder = _folder(tmp_path)
    old = {"files": {"README.md": {"sha256": sha256_file(folder / "README.md"), "bytes": 4}}}
    (folder / "manifest.json").write_text(json.dumps(old))
    assert Manifest.load(folder / "manifest.json").version == 1 and verify_manifest(folder) == []
    (folder / "README.md").write_text("edit")
    assert verify_manifest(folder) == ["README.md: content differs from the manifest"]


@pytest.mark.parametrize("stored", [{}, {"files": ["README.md"]}, {"files": {"README.md": {"bytes": 4}}}],
                         ids=["no files", "a list", "an entry without its sha256"])
def test_a_manifest_without_what_a_check_needs_is_an_error(tmp_path, stored):
    folder = _folder(tmp_path)
    (folder / "manifest.json").write_text(json.dumps(stored))
    with pytest.raises(ValidationError):
        verify_manifest(folder)


def test_a_writer_that_leaves_out_a_size_is_refused():
    with pytest.raises(ValidationError):
        Manifest.written(files={"README.md": {"sha256": "0" * 64}})
    assert FileEntry(sha256="0" * 64, bytes=0).bytes == 0
