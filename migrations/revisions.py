"""Running the migrations and asking where a database stands: the seam between the code and its schema.

The Alembic configuration is built in code so that an installed package finds its migrations through this
package itself, whatever the working directory. `require_current_schema` is the one check that a process
(the API, a worker) makes before it serves: the database is reachable and at the code's head revision.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, pool

from domain.database_url import ensure_sqlite_directory, normalize_database_url

UPGRADE_HINT = "run `draftsmith db upgrade`"


class SchemaNotReady(RuntimeError):
    """The database cannot be reached, or its schema is not the one this code was written for."""


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    url = normalize_database_url(database_url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolation
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    ensure_sqlite_directory(database_url)
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


@functools.cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def check_schema_is_current(engine: Engine) -> None:
    """Raise SchemaNotReady if the database is not at the code's head revision (used by /readyz)."""
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    head = head_revision()
    if current != head:
        raise SchemaNotReady(f"schema at {current or 'nothing'}, code needs {head}: {UPGRADE_HINT}")


def require_current_schema(database_url: str) -> None:
    """Before serving: the database answers and its schema is the code's; SchemaNotReady says what to do."""
    try:
        current = current_revision(database_url)
    except Exception as exc:
        raise SchemaNotReady(f"cannot reach the database {database_url}: {exc}") from exc
    if current != head_revision():
        raise SchemaNotReady(f"database schema is at {current or 'nothing'}, code expects {head_revision()}: "
                             f"{UPGRADE_HINT}")
