"""The `draftsmith` command.

Subcommands live next to the code they drive (trainer/cli.py, api/cli.py, worker/cli.py) and are
imported only when invoked, so `draftsmith api` never loads torch and `draftsmith run` never loads
FastAPI.
"""

from __future__ import annotations

import importlib

import click

from draftsmith import __version__

# name -> "module:attribute" of a click command or group.
LAZY_COMMANDS: dict[str, str] = {
    "target": "trainer.cli:target",
    "decode": "trainer.cli:decode",
    "generate": "trainer.cli:generate",
    "train": "trainer.cli:train",
    "validate": "trainer.cli:validate",
    "export": "trainer.cli:export",
    "run": "trainer.cli_run:run",
    "api": "api.cli:api",
    "db": "api.cli:db",
    "keys": "api.cli:keys",
    "worker": "worker.cli:worker",
    "serve": "worker.cli:serve",
    "submit": "draftsmith.submit:submit",
    "resume": "draftsmith.submit:resume",
    "cancel": "draftsmith.submit:cancel",
    "jobs": "draftsmith.jobs_cli:jobs",
    "download": "draftsmith.jobs_cli:download",
    "audit": "draftsmith.pipeline_cli:audit",
    "drafters": "draftsmith.pipeline_cli:drafters",
    "usage": "draftsmith.pipeline_cli:usage",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a room not built yet, or an optional extra missing
            raise click.ClickException(f"`draftsmith {name}` is unavailable: {exc}") from exc
        return getattr(module, attribute)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="draftsmith")
def main() -> None:
    """Train DFlash 2 speculative-decoding drafters for your own models."""


if __name__ == "__main__":  # `python -m draftsmith.cli`, used when relaunching under torchrun
    main()
