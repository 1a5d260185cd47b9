"""schemas/bounds.py `file_uri_path`: the one parser of a file:// URI (issue 34)."""

from __future__ import annotations

import pytest

from schemas.bounds import file_uri_path
from schemas.job_spec import check_uri


def test_what_a_file_uri_names():
    assert file_uri_path("file:///data/x.jsonl") == "/data/x.jsonl"
    assert file_uri_path("file://localhost/data/x") == "/data/x"
    assert file_uri_path("file:///data/a%20b") == "/data/a b"
    assert file_uri_path("file:///data/x?query#fragment") == "/data/x"


@pytest.mark.parametrize("uri", ["file://elsewhere/data", "file:relative", "s3://bucket/key", "/data/x"])
def test_what_is_not_a_local_file_uri(uri):
    with pytest.raises(ValueError):
        file_uri_path(uri)


def test_admission_checks_the_path_the_worker_reads(tmp_path):
    """A query is not part of the path: admission judges the path `file_uri_path` gives, the one read later."""
    uri = f"file://{tmp_path}/x.jsonl?v=1"
    assert check_uri(uri, [str(tmp_path)], allow_bundled=False) == uri
    with pytest.raises(ValueError, match="outside the allowed roots"):
        check_uri(f"file://{tmp_path}-other/x.jsonl?{tmp_path}", [str(tmp_path)], allow_bundled=False)
