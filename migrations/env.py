"""Alembic environment: one set of migrations for PostgreSQL and SQLite.

SQLite cannot ALTER most things in place, so migrations run with `render_as_batch` there
(Alembic recreates the table); PostgreSQL runs the same operations directly.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from domain.database_url import normalize_database_url
from domain.models import Base

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from domain.settings import load_settings

        url = load_settings().database_url
    return normalize_database_url(url).render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    url = _database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # No SQLite pragmas here on purpose: batch mode copies tables, which foreign key checks would block.
    engine = create_engine(_database_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


def _run(connection) -> None:  # noqa: ANN001 - a SQLAlchemy Connection
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
