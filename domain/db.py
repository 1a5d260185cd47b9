"""Engines and sessions for PostgreSQL (production) and SQLite (embedded default).

Tables are created and changed only by the Alembic migrations in `migrations/`, run explicitly
(`draftsmith db upgrade`, or `migrations.revisions.upgrade()`), never as a side effect of importing or
starting the API.

On PostgreSQL every connection of an engine can carry server-side limits (`SessionTimeouts`): the longest a
statement may run and the longest a connection may sit idle inside a transaction. The server enforces them even
when the process that opened the transaction is stuck, so no request can hold a lock past its own life.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, cast

# The handles of DATABASE_HANDLES are re-exported (`X as X`: mypy's no_implicit_reexport).
from sqlalchemy import Connection as Connection
from sqlalchemy import CursorResult, Engine, Executable, create_engine, event, pool, text
from sqlalchemy import Row as Row
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session as Session
from sqlalchemy.orm import sessionmaker as sessionmaker

from domain.database_url import ensure_sqlite_directory, normalize_database_url
from domain.settings import Settings

# The database handles the API and the worker hold and pass on (a session, a connection, a factory of sessions, a
# result row), named here so that code outside domain/ annotates them without importing SQLAlchemy: the queries
# themselves live in domain/ (tests/test_layout.py names the few files elsewhere that may import it).
DATABASE_HANDLES = (Connection, Row, Session, sessionmaker)

# How long a request waits for a row another transaction has locked (`lock_briefly`). Row locks are held for
# milliseconds (a state change and its commit); a wait this long means the holder is stuck, and the request is
# better answered 503 with Retry-After than left holding a worker thread.
ROW_LOCK_TIMEOUT_SECONDS = 3.0


def execute_dml(session: Session, statement: Executable) -> CursorResult[Any]:
    """`session.execute` for an UPDATE, DELETE or INSERT, typed as what it returns there: a CursorResult, whose
    `rowcount` is how many rows the statement matched (SQLAlchemy 2.1 types every `execute` as a plain Result)."""
    return cast("CursorResult[Any]", session.execute(statement))


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


@dataclass(frozen=True)
class SessionTimeouts:
    """PostgreSQL limits set on every connection of an engine, as startup options (no round trip per checkout).
    None or 0 leaves the server's own setting.

    `statement_seconds`: a statement running longer (waiting for a lock included) is cancelled by the server.
    `idle_in_transaction_seconds`: a connection left idle inside a transaction this long is closed by the server,
    which rolls the transaction back and frees its locks, whatever became of the process that opened it."""

    statement_seconds: float | None = None
    idle_in_transaction_seconds: float | None = None

    @classmethod
    def for_api(cls, settings: Settings) -> SessionTimeouts:
        return cls(settings.database_statement_timeout_seconds, settings.database_idle_in_transaction_timeout_seconds)

    @classmethod
    def for_worker(cls, settings: Settings) -> SessionTimeouts:
        return cls(settings.worker_database_statement_timeout_seconds,
                   settings.worker_database_idle_in_transaction_timeout_seconds)

    def options(self) -> str:
        """libpq's `options`: `-c name=value` per limit that is set, in milliseconds."""
        limits = (("statement_timeout", self.statement_seconds),
                  ("idle_in_transaction_session_timeout", self.idle_in_transaction_seconds))
        return " ".join(f"-c {name}={max(1, round(seconds * 1000))}" for name, seconds in limits if seconds)


def _postgres_connect_args(url: URL, timeouts: SessionTimeouts | None) -> dict[str, Any]:
    options = timeouts.options() if timeouts is not None else ""
    if not options:
        return {}
    # connect_args replace the URL's own `options` (?options=...): keep those too, ours last (they win).
    given = url.query.get("options")
    given = " ".join(given) if isinstance(given, tuple) else given
    return {"options": f"{given} {options}" if given else options}


def create_db_engine(
    database_url: str, *, echo: bool = False, null_pool: bool = False, limits: PoolLimits | None = None,
    timeouts: SessionTimeouts | None = None,
) -> Engine:
    """`null_pool`: a connection per use, none kept (a background thread of a process that forks children).
    `timeouts`: PostgreSQL's statement and idle-in-transaction limits for every connection (ignored on SQLite)."""
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
    return create_engine(url, pool_pre_ping=limits.pre_ping and not null_pool,
                         connect_args=_postgres_connect_args(url, timeouts), **common, **pooling)


def create_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: routes serialise objects after committing them.
    return sessionmaker(bind=engine, expire_on_commit=False)


def lock_briefly(session: Session, seconds: float = ROW_LOCK_TIMEOUT_SECONDS) -> None:
    """Bound the waits for locks in the session's current transaction (PostgreSQL's `lock_timeout`, for this
    transaction only): a lock not granted within `seconds` fails the statement with OperationalError (the API
    answers 503 with Retry-After) instead of waiting as long as the holder does. SQLite has no row locks."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL lock_timeout = {max(1, round(seconds * 1000))}"))


def ping(engine: Engine) -> None:
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
