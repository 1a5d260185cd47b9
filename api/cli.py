"""`draftsmith api`, `draftsmith db ...` and `draftsmith keys ...` (registered lazily by draftsmith/cli.py)."""

from __future__ import annotations

import os
import tempfile

import click
from pydantic import ValidationError

from domain.settings import Settings, load_settings


def _settings(**overrides: object) -> Settings:
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except (ValidationError, ValueError) as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="uvicorn worker processes.")
@click.option("--reload", is_flag=True, help="Restart on code changes (development).")
def api(host: str, port: int, workers: int, reload: bool) -> None:
    """Serve the REST API (run `draftsmith db upgrade` first)."""
    import uvicorn

    from migrations.revisions import SchemaNotReady, require_current_schema

    settings = _settings()
    try:
        require_current_schema(settings.database_url)
    except SchemaNotReady as exc:
        raise click.ClickException(str(exc)) from exc
    from api.observability import PROCESS_COUNT_ENV, PROCESS_DIR_ENV

    # The worker processes inherit these: a directory where each shows the others its capacity counters, and how
    # many there are (/readyz lists every process's; api/observability.py ProcessBoard). Removed on exit.
    with tempfile.TemporaryDirectory(prefix="draftsmith-api-") as processes:
        os.environ[PROCESS_DIR_ENV], os.environ[PROCESS_COUNT_ENV] = processes, str(workers)
        # http="httptools": uvicorn's C HTTP/1.1 parser (a base dependency), not the pure-Python h11 that plain
        # `uvicorn` falls back to: it cost about a millisecond of CPU per request.
        # timeout_graceful_shutdown: on SIGTERM uvicorn otherwise waits for every request in progress, however long
        # it is stuck (a stuck process then ignored SIGTERM). After this long it cancels them, the app's shutdown
        # interrupts their database statements (api/deps.py Services.close), and the process exits.
        uvicorn.run("api.main:app", host=host, port=port, workers=workers, reload=reload, proxy_headers=True,
                    http="httptools", timeout_graceful_shutdown=settings.api_graceful_shutdown_seconds)


@click.group()
def db() -> None:
    """Database schema migrations (Alembic)."""


@db.command()
@click.option("--revision", default="head", show_default=True)
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def upgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database schema up to REVISION."""
    from migrations.revisions import current_revision
    from migrations.revisions import upgrade as run_upgrade

    settings = _settings(database_url=database_url)
    run_upgrade(settings.database_url, revision)
    click.echo(f"database at revision {current_revision(settings.database_url)}")


@db.command()
@click.option("--revision", default="-1", show_default=True, help="Target revision; `base` removes every table.")
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database schema down to REVISION."""
    from migrations.revisions import current_revision
    from migrations.revisions import downgrade as run_downgrade

    settings = _settings(database_url=database_url)
    run_downgrade(settings.database_url, revision)
    click.echo(f"database at revision {current_revision(settings.database_url) or 'base (empty)'}")


@db.command()
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def current(database_url: str | None) -> None:
    """Show the database's schema revision and the code's."""
    from migrations.revisions import current_revision, head_revision

    settings = _settings(database_url=database_url)
    click.echo(f"database: {current_revision(settings.database_url) or 'empty'}; code: {head_revision()}")


@click.group()
def keys() -> None:
    """API keys."""


@keys.command()
@click.option("--org", "org_name", required=True, help="Organisation name (created if new).")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(["read", "write", "admin"]),
              help="Repeatable; default read+write.")
@click.option("--name", default="default", show_default=True, help="A label to recognise the key by.")
@click.option("--max-concurrent-jobs", type=click.IntRange(1, 10_000), default=None,
              help="Set the organisation's limit on active jobs.")
@click.option("--monthly-compute-seconds", type=click.IntRange(1, 2**62), default=None,
              help="Set the organisation's monthly quota of compute seconds (wall x devices).")
@click.option("--monthly-tokens-generated", type=click.IntRange(1, 2**62), default=None,
              help="Set the organisation's monthly quota of tokens generated by targets.")
@click.option("--monthly-tokens-trained", type=click.IntRange(1, 2**62), default=None,
              help="Set the organisation's monthly quota of drafter tokens trained.")
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def create(org_name: str, scopes: tuple[str, ...], name: str, max_concurrent_jobs: int | None,
           monthly_compute_seconds: int | None, monthly_tokens_generated: int | None,
           monthly_tokens_trained: int | None, database_url: str | None) -> None:
    """Create an API key and print it (it is shown only this once)."""
    from domain.db import create_db_engine, create_session_factory
    from domain.keys import issue_api_key

    settings = _settings(database_url=database_url)
    engine = create_db_engine(settings.database_url)
    limits = {"max_concurrent_jobs": max_concurrent_jobs, "monthly_compute_seconds": monthly_compute_seconds,
              "monthly_tokens_generated": monthly_tokens_generated, "monthly_tokens_trained": monthly_tokens_trained}
    try:
        with create_session_factory(engine)() as session:
            issued = issue_api_key(session, settings, org_name=org_name, scopes=list(scopes or ("read", "write")),
                                   name=name, limits=limits)
    finally:
        engine.dispose()
    click.echo(f"organisation: {org_name} ({issued.org_id})", err=True)
    click.echo(f"key id:       {issued.key_id}  scopes: {','.join(issued.scopes)}", err=True)
    click.echo("store this key now; it is not shown again:", err=True)
    click.echo(issued.plaintext)


@keys.command()
@click.argument("key_id")
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def revoke(key_id: str, database_url: str | None) -> None:
    """Revoke the key KEY_ID (key_...); requests with it then get 401."""
    from domain.db import create_db_engine, create_session_factory
    from domain.keys import revoke_api_key

    settings = _settings(database_url=database_url)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            if not revoke_api_key(session, key_id):
                raise click.ClickException(f"no key {key_id}")
    finally:
        engine.dispose()
    click.echo(f"revoked {key_id}")
