"""Alembic migrations on an empty SQLite file and an empty PostgreSQL database: upgrade to head gives
exactly the models' schema, downgrade to base removes every table, and upgrading again works."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, pool

from domain.database_url import normalize_database_url
from domain.models import Base
from migrations.revisions import current_revision, downgrade, head_revision, upgrade


def _tables(url: str) -> set[str]:
    engine = create_engine(normalize_database_url(url), poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _schema_drift(url: str) -> list:
    engine = create_engine(normalize_database_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return request.getfixturevalue("fresh_postgres_url")


def test_upgrade_from_empty_and_downgrade_cleanly(empty_database):
    model_tables = {table.name for table in Base.metadata.sorted_tables}
    assert _tables(empty_database) == set()
    upgrade(empty_database)
    assert current_revision(empty_database) == head_revision()
    assert _tables(empty_database) == model_tables | {"alembic_version"}
    assert _schema_drift(empty_database) == []  # migrations and models describe the same schema

    downgrade(empty_database, "base")
    assert current_revision(empty_database) is None
    assert _tables(empty_database) <= {"alembic_version"}

    upgrade(empty_database)  # and back up again from nothing
    assert _tables(empty_database) == model_tables | {"alembic_version"}


def test_db_commands(tmp_path, monkeypatch):
    from api.cli import db

    url = f"sqlite:///{tmp_path / 'sub' / 'cli.db'}"
    monkeypatch.setenv("DRAFTSMITH_ENV", "development")
    runner = CliRunner()
    result = runner.invoke(db, ["upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert f"revision {head_revision()}" in result.output
    result = runner.invoke(db, ["current", "--database-url", url])
    assert f"database: {head_revision()}" in result.output
    result = runner.invoke(db, ["downgrade", "--revision", "base", "--database-url", url])
    assert result.exit_code == 0 and "base (empty)" in result.output
    assert _tables(url) <= {"alembic_version"}


def test_importing_the_app_does_not_touch_the_database(tmp_path, monkeypatch):
    """Migrations are an explicit step: serving requests against an unmigrated database fails
    readiness instead of creating tables behind the operator's back."""
    from api_harness import make_settings
    from fastapi.testclient import TestClient

    from api.main import create_app

    url = f"sqlite:///{tmp_path / 'never-migrated.db'}"
    app = create_app(make_settings(url, tmp_path / "storage"))
    with TestClient(app, raise_server_exceptions=False) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"] == "ok"
        assert "draftsmith db upgrade" in ready.json()["checks"]["schema"]
        response = client.get("/v1/jobs", headers={"Authorization": "Bearer dsk_" + "x" * 43})
        assert response.status_code == 500 and response.json()["type"].endswith("internal-error")
    assert _tables(url) == set()
