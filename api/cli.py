"""`draftsmith api`, `draftsmith db ...` and `draftsmith keys ...` (registered lazily by draftsmith/cli.py)."""

from __future__ import annotations

import click
from pydantic import ValidationError

from api.settings import Settings, load_settings


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

    from api.db import current_revision, head_revision

    settings = _settings()
    try:
        current = current_revision(settings.database_url)
    except Exception as exc:
        raise click.ClickException(f"cannot reach the database {settings.database_url}: {exc}") from exc
    if current != head_revision():
        raise click.ClickException(
            f"database schema is at {current or 'nothing'}, code expects {head_revision()}: run `draftsmith db upgrade`"
        )
    uvicorn.run("api.main:app", host=host, port=port, workers=workers, reload=reload, proxy_headers=True)


@click.group()
def db() -> None:
    """Database schema migrations (Alembic)."""


@db.command()
@click.option("--revision", default="head", show_default=True)
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def upgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database schema up to REVISION."""
    from api.db import current_revision, upgrade as run_upgrade

    settings = _settings(database_url=database_url)
    run_upgrade(settings.database_url, revision)
    click.echo(f"database at revision {current_revision(settings.database_url)}")


@db.command()
@click.option("--revision", default="-1", show_default=True, help="Target revision; `base` removes every table.")
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database schema down to REVISION."""
    from api.db import current_revision, downgrade as run_downgrade

    settings = _settings(database_url=database_url)
    run_downgrade(settings.database_url, revision)
    click.echo(f"database at revision {current_revision(settings.database_url) or 'base (empty)'}")


@db.command()
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def current(database_url: str | None) -> None:
    """Show the database's schema revision and the code's."""
    from api.db import current_revision, head_revision

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
@click.option("--database-url", default=None, help="Overrides DRAFTSMITH_DATABASE_URL.")
def create(org_name: str, scopes: tuple[str, ...], name: str, max_concurrent_jobs: int | None,
           database_url: str | None) -> None:
    """Create an API key and print it (it is shown only this once)."""
    from api.auth import create_api_key
    from api.db import create_db_engine, create_session_factory
    from api.models import Organisation

    settings = _settings(database_url=database_url)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            issued = create_api_key(session, settings, org_name=org_name, scopes=list(scopes or ("read", "write")),
                                    name=name)
            if max_concurrent_jobs is not None:
                org = session.get(Organisation, issued.org_id)
                assert org is not None
                org.max_concurrent_jobs = max_concurrent_jobs
            session.commit()
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
    from api.db import create_db_engine, create_session_factory
    from api.models import ApiKey, utcnow

    settings = _settings(database_url=database_url)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            key = session.get(ApiKey, key_id)
            if key is None:
                raise click.ClickException(f"no key {key_id}")
            key.revoked_at = key.revoked_at or utcnow()
            session.commit()
    finally:
        engine.dispose()
    click.echo(f"revoked {key_id}")
