"""`draftsmith worker` (a Celery worker) and `draftsmith serve` (the API and a worker on one machine)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import click

QUEUE_KINDS = ("gpu", "cpu")


def _settings():
    from pydantic import ValidationError

    from domain.settings import load_settings

    try:
        return load_settings()
    except (ValidationError, ValueError) as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc


def _require_current_schema(settings) -> None:
    from migrations.revisions import SchemaNotReady, require_current_schema

    try:
        require_current_schema(settings.database_url)
    except SchemaNotReady as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@click.option("--queues", default="gpu,cpu", show_default=True,
              help="Queue kinds to consume: gpu (prepare, generate, train, validate), cpu (export, publish) or both.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Jobs at once. Keep 1 per GPU machine: training takes every device.")
@click.option("--loglevel", default="info", show_default=True)
def worker(queues: str, concurrency: int, loglevel: str) -> None:
    """Run a Celery worker that executes job stages (settings from DRAFTSMITH_* variables)."""
    kinds = [kind.strip() for kind in queues.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(QUEUE_KINDS))
    if unknown or not kinds:
        raise click.BadParameter(f"{','.join(unknown) or 'nothing'}: choose from {', '.join(QUEUE_KINDS)}",
                                 param_hint="--queues")
    settings = _settings()
    _require_current_schema(settings)
    names = [f"{settings.queue_name}.{kind}" for kind in kinds]
    os.environ["DRAFTSMITH_WORKER_QUEUES"] = ",".join(names)  # read by worker.context in every pool process
    # A worker is never a rank itself: launcher variables inherited from a parent that trained in-process would
    # point every in-process training at that parent's (busy) rendezvous port.
    from trainer.pipeline import LAUNCHER_VARIABLES

    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    from worker.app import app

    argv = ["worker", "--queues", ",".join(names), "--concurrency", str(concurrency), "--loglevel", loglevel,
            "--pool", "prefork", "--hostname", f"draftsmith-{'-'.join(kinds)}-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle"]
    if "gpu" in kinds:
        argv += ["--max-tasks-per-child", "1"]  # a fresh process per job: device memory is returned in full
    click.echo(f"worker consuming {', '.join(names)}", err=True)
    app.worker_main(argv)


def embedded_environment(data_dir: Path) -> dict[str, str]:
    """Settings for one machine: SQLite, a file-backed broker and local storage under `data_dir`, unless the
    environment already names real ones (then this is production wiring on one host). A development key and
    secret are made once per data directory and kept there."""
    data_dir.mkdir(parents=True, exist_ok=True)

    def kept(name: str, make) -> str:
        path = data_dir / name
        if not path.is_file():
            path.write_text(make())
            path.chmod(0o600)
        return path.read_text().strip()

    defaults = {
        "DRAFTSMITH_ENV": "development",
        "DRAFTSMITH_DATABASE_URL": f"sqlite:///{data_dir / 'draftsmith.db'}",
        "DRAFTSMITH_BROKER_URL": "filesystem://",
        "DRAFTSMITH_BROKER_FOLDER": str(data_dir / "broker"),
        "DRAFTSMITH_STORAGE_URL": (data_dir / "storage").as_uri(),
        "DRAFTSMITH_WORKER_CACHE_DIR": str(data_dir / "worker-cache"),
        "DRAFTSMITH_SECRET_KEY": kept("secret-key", lambda: secrets.token_urlsafe(48)),
        "DRAFTSMITH_DEV_API_KEY": kept("dev-api-key", lambda: "dsk_dev_" + secrets.token_urlsafe(24)),
    }
    return {**defaults, **{k: v for k, v in os.environ.items() if k.startswith("DRAFTSMITH_")}}


WORKER_STOP_SECONDS = 30
"""How long `serve` lets its worker finish a warm shutdown (running stages checkpoint and hand over) before
killing it."""


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """In the worker child: get SIGTERM when `serve` exits however it exits (uvicorn ends its own process by
    re-raising the signal it caught, so a `finally` in serve does not always run)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".draftsmith"), show_default=True,
              help="Database, broker messages, artifacts and the worker cache.")
def serve(host: str, port: int, data_dir: Path) -> None:
    """The whole service on this machine: the API and one worker, no servers to install."""
    env = embedded_environment(data_dir.resolve())
    os.environ.update(env)
    from migrations.revisions import upgrade

    settings = _settings()
    upgrade(settings.database_url)
    worker_process = subprocess.Popen([sys.executable, "-m", "draftsmith.cli", "worker", "--queues", "gpu,cpu"],
                                      env={**os.environ, **env}, start_new_session=True,
                                      preexec_fn=_die_with_parent)
    url = f"http://{host}:{port}"
    click.echo(f"Draftsmith is serving at {url}", err=True)
    key = settings.dev_api_key.get_secret_value()
    click.echo(f"API key (development): {key}", err=True)
    click.echo(f"try: draftsmith submit --url {url} --api-key {key} --target bundled:smollm2-135m --wait", err=True)
    import uvicorn

    # uvicorn restores the handler it found and re-raises the SIGTERM it caught: with Python's default handler that
    # ends this process on the spot, the `finally` below never runs and the worker is left to its own warm
    # shutdown. Raising SystemExit instead runs the `finally`, which gives the worker WORKER_STOP_SECONDS.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        # timeout_graceful_shutdown: uvicorn otherwise waits on SIGTERM for every open response, and an event stream
        # (`submit --wait`, the dashboard) stays open until its job ends: serve ignored SIGTERM. After this long
        # the streams are cancelled (clients reconnect elsewhere or say the server is gone) and serve goes on to
        # stop its worker. The same setting as `draftsmith api`'s.
        uvicorn.run("api.main:app", host=host, port=port, log_level="info",
                    timeout_graceful_shutdown=settings.api_graceful_shutdown_seconds)
    finally:
        # SIGTERM to the worker's main process only: Celery's warm shutdown stops its pool children itself. Signalled
        # directly, a child can die holding the pool's queue lock, and the main process then waits on it for ever.
        worker_process.terminate()
        try:
            worker_process.wait(timeout=WORKER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(worker_process.pid, signal.SIGKILL)
