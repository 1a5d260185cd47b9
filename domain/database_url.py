"""The one rule for reading a database URL, shared by the engines (domain/db.py) and the migrations."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url


def normalize_database_url(raw: str) -> URL:
    """Accept `postgresql://` / `postgres://` and pin the psycopg 3 driver we ship."""
    url = make_url(raw.replace("postgres://", "postgresql://", 1) if raw.startswith("postgres://") else raw)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def ensure_sqlite_directory(database_url: str) -> None:
    """SQLite creates its file but not the folder around it: make that, for a file-backed URL."""
    url = normalize_database_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
