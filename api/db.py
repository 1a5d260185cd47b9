"""Engines, sessions and migrations for PostgreSQL (production) and SQLite (embedded default).

Tables are created and changed only by the Alembic migrations in `migrations/`, run explicitly
(`draftsmith db upgrade`, or `upgrade()` here), never as a side effect of importing or starting the
API. The Alembic configuration is built in code so an installed package finds its migrations
through the `migrations` package itself, whatever the working directory.
"""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, pool, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

import migrations


def normalize_database_url(raw: str) -> URL:
    """Accept `postgresql://` / `postgres://` and pin the psycopg 3 driver we ship."""
    url = make_url(raw.replace("postgres://", "postgresql://", 1) if raw.startswith("postgres://") else raw)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def _configure_sqlite(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Foreign keys are off by default in SQLite; WAL lets the SSE readers poll while a writer commits.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


@dataclass(frozen=True)
class PoolLimits:
    """Connections an engine keeps (`size`), may open beyond them (`overflow`), and how long a checkout waits
    before failing (`timeout_seconds`). The API sizes them from its thread count (`Settings.pool_limits`)."""

    size: int = 10
    overflow: int = 20
    timeout_seconds: float = 30.0
    # A ping per checkout finds connections a database restart left dead, for one round trip each time.
    # Without it, the first use of a dead connection fails (and SQLAlchemy then replaces the whole pool).
    pre_ping: bool = True


def create_db_engine(
    database_url: str, *, echo: bool = False, null_pool: bool = False, limits: PoolLimits | None = None
) -> Engine:
    """`null_pool`: a connection per use, none kept (a background thread of a process that forks children)."""
    url = normalize_database_url(database_url)
    limits = limits or PoolLimits()
    pooling: dict[str, Any] = {"poolclass": pool.NullPool} if null_pool else {}
    if not null_pool and url.database not in (None, "", ":memory:"):
        pooling = {"pool_size": limits.size, "max_overflow": limits.overflow, "pool_timeout": limits.timeout_seconds}
    # hide_parameters: a failed statement's bound values (webhook secrets, key hashes, credentials) never
    # reach exception messages, and so never the logs.
    common: dict[str, Any] = {"echo": echo, "hide_parameters": True}
    if url.get_backend_name() == "sqlite":
        _ensure_sqlite_directory(database_url)
        # timeout: wait for the write lock instead of failing at once when the worker is writing.
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **common, **pooling)
        event.listen(engine, "connect", _configure_sqlite)
        return engine
    return create_engine(url, pool_pre_ping=limits.pre_ping and not null_pool, **common, **pooling)


def create_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: routes serialise objects after committing them.
    return sessionmaker(bind=engine, expire_on_commit=False)


def ping(engine: Engine) -> None:
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    url = normalize_database_url(database_url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolation
    return config


def _ensure_sqlite_directory(database_url: str) -> None:
    url = normalize_database_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)


def upgrade(database_url: str, revision: str = "head") -> None:
    _ensure_sqlite_directory(database_url)
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "-1") -> None:
    command.downgrade(alembic_config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    engine = create_engine(normalize_database_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def check_schema_is_current(engine: Engine) -> None:
    """Raise if the database is not at the code's head revision (used by /readyz)."""
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    head = head_revision()
    if current != head:
        raise RuntimeError(f"schema at {current or 'nothing'}, code needs {head}: run `draftsmith db upgrade`")


@functools.cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
