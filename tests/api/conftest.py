"""Fixtures for the control-plane tests: real PostgreSQL and SQLite databases migrated with Alembic,
an app per test with its own organisations and keys, and the fake stage runner.

PostgreSQL: a fresh database named draftsmith_api_test_<random> on 127.0.0.1:5432 (trust auth),
dropped at the end of the session. Set DRAFTSMITH_TEST_POSTGRES_URL to use another server, or
DRAFTSMITH_TEST_SKIP_POSTGRES=1 to run the SQLite half only (the PostgreSQL tests then skip,
loudly); by default an unreachable server is an error, not a silent skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database  # tests/services.py

from migrations.revisions import upgrade


def _fresh_postgres_database(prefix: str) -> tuple[str, Any]:
    """Create a uniquely named database; return its URL and a function that drops it."""
    if os.environ.get("DRAFTSMITH_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("PostgreSQL tests disabled by DRAFTSMITH_TEST_SKIP_POSTGRES=1")
    return fresh_postgres_database(prefix)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    url, drop = _fresh_postgres_database("draftsmith_api_test")
    yield url
    drop()


@pytest.fixture
def fresh_postgres_url() -> Iterator[str]:
    """An empty database of its own, for migration tests."""
    url, drop = _fresh_postgres_database("draftsmith_api_mig")
    yield url
    drop()


@pytest.fixture(scope="module")
def module_postgres_url() -> Iterator[str]:
    """A migrated database of the test module's own, for tests whose leftovers (e.g. pending webhook
    deliveries from a fuzzer) other tests on the shared database would trip over."""
    url, drop = _fresh_postgres_database("draftsmith_api_mod")
    upgrade(url)
    yield url
    drop()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database shared by the session; tests isolate themselves with their own organisations."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'draftsmith.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database, for tests whose subject does not depend on the database."""
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite-only') / 'draftsmith.db'}"
    upgrade(url)
    return url


@pytest.fixture
def harness(database_url: str, tmp_path: Path) -> Iterator[Harness]:
    """An app on the session's database (SQLite and PostgreSQL in turn), broker disabled."""
    yield from build_harness(make_settings(database_url, tmp_path / "storage"))


@pytest.fixture
def sqlite_harness(sqlite_url: str, tmp_path: Path) -> Iterator[Harness]:
    yield from build_harness(make_settings(sqlite_url, tmp_path / "storage"))
