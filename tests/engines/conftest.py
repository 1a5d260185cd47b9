"""tests/engines/ look for the engines where they really are (tests/conftest.py hides them from the rest)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def real_engines_dir(monkeypatch):
    real = os.environ.get("DRAFTSMITH_TEST_REAL_ENGINES_DIR")
    if real:
        monkeypatch.setenv("DRAFTSMITH_ENGINES_DIR", real)
    else:
        monkeypatch.delenv("DRAFTSMITH_ENGINES_DIR", raising=False)
