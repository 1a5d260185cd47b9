"""tests/engines/ look for the engines where they really are (tests/conftest.py hides them from the rest)."""

from __future__ import annotations

import os

import pytest

from trainer.validation.engine_paths import ENGINES_DIR_ENV


@pytest.fixture(autouse=True)
def real_engines_dir(monkeypatch):
    real = os.environ.get("DRAFTSMITH_TEST_REAL_ENGINES_DIR")
    if real:
        monkeypatch.setenv(ENGINES_DIR_ENV, real)
    else:
        monkeypatch.delenv(ENGINES_DIR_ENV, raising=False)
