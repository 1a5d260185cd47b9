"""Engines and sessions for PostgreSQL (production) and SQLite (embedded default).

Tables are created and changed only by the Alembic migrations in `migrations/`, run explicitly
(`draftsmith db upgrade`, or `migrations.revisions.upgrade()`), never as a side effect of importing or
starting the API.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event, pool, text
from sqlalchemy.orm import Session, sessionmaker

from domain.database_url import ensure_sqlite_directory, normalize_database_url


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
        ensure_sqlite_directory(database_url)
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
