"""`draftsmith submit`: send a job to a Draftsmith server, follow it, fetch what it made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def _set_field(body: dict, assignment: str) -> None:
    """`training.max_steps=50` -> body["training"]["max_steps"] = 50 (the value parsed as JSON when it can be)."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise click.BadParameter(f"{assignment!r}: use FIELD=VALUE, e.g. training.max_steps=50", param_hint="--set")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    *parents, leaf = path.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


@click.command()
@click.option("--url", envvar="DRAFTSMITH_URL", default="http://127.0.0.1:8000", show_default=True,
              help="The server (env DRAFTSMITH_URL).")
@click.option("--api-key", envvar="DRAFTSMITH_API_KEY", default=None, help="env DRAFTSMITH_API_KEY.")
@click.option("--target", default=None, help="Target URI: bundled:NAME, hf://org/name[@rev], s3://..., file:///...")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="A job spec (JSON body of POST /v1/jobs); --target and --set override its fields.")
@click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
              help="Set a spec field, e.g. --set training.max_steps=50 --set drafter.block_size=16 (repeatable).")
@click.option("--idempotency-key", default=None, help="Submitting again with the same key returns the same job.")
@click.option("--wait", is_flag=True, help="Follow the job with a progress bar until it ends.")
@click.option("--download", "download_dir", type=click.Path(path_type=Path), default=None,
              help="After success, download every artifact here and verify it against the manifest (implies --wait).")
def submit(url, api_key, target, spec_file, assignments, idempotency_key, wait, download_dir) -> None:
    """Submit a drafter-training job; with --wait, exit 0 only if it succeeds."""
    from draftsmith.client import ApiError, Client, DownloadError, Unreachable

    body = json.loads(spec_file.read_text()) if spec_file else {}
    if target:
        body.setdefault("target", {})["uri"] = target
    for assignment in assignments:
        _set_field(body, assignment)
    if "target" not in body:
        raise click.UsageError("give --target URI or --spec FILE")
    with Client(url, api_key) as client:
        try:
            job = client.create_job(body, idempotency_key=idempotency_key)
            click.echo(f"job {job['id']} {job['status']}", err=True)
            if not (wait or download_dir):
                click.echo(job["id"])
                return
            job = client.wait(job["id"], on_event=_progress_printer())
            _report(job)
            if job["status"] != "succeeded":  # 3: the lossless check failed (never serve it); 1: anything else
                sys.exit(3 if (job.get("error") or {}).get("code") == "not_lossless" else 1)
            if download_dir:
                client.download(job["id"], download_dir)
                click.echo(f"artifacts verified against manifest.json in {download_dir}", err=True)
            click.echo(job["id"])
        except (ApiError, Unreachable) as error:
            raise click.ClickException(str(error)) from None
        except DownloadError as error:
            raise click.ClickException(f"download failed verification: {error}") from None


def _progress_printer():
    """An event callback drawing one progress bar per stage (rich), fed by the SSE stream."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), TextColumn("{task.fields[detail]}"), transient=False)
    bars: dict[str, int] = {}
    plain = not progress.console.is_terminal

    def on_event(event: dict) -> None:
        stage = event.get("stage")
        if event["type"] in ("stage.progress", "stage.started", "stage.finished") and stage:
            if stage not in bars:
                if not bars and not plain:
                    progress.start()
                bars[stage] = progress.add_task(stage, total=100, detail="")
            percent = event.get("progress") or 0.0
            progress.update(bars[stage], completed=percent, detail=event["message"][:60])
            if plain:
                click.echo(f"{stage:<10} {percent:5.1f}%  {event['message']}", err=True)
        elif event["type"] in ("job.status_changed", "stage.failed", "publish.completed", "artifact.created") \
                or event["level"] in ("warning", "error"):
            (progress.console.print if not plain else lambda m: click.echo(m, err=True))(
                f"[{event['type']}] {event['message']}")
        if event["type"] == "job.status_changed" and event.get("data", {}).get("to") in ("succeeded", "failed",
                                                                                        "cancelled"):
            progress.stop()

    return on_event


def _report(job: dict) -> None:
    summary = {"id": job["id"], "status": job["status"], "run_attempts": job.get("run_attempts"),
               "stages": {s["stage"]: s["status"] for s in job["stages"]}}
    if job.get("error"):
        summary["error"] = job["error"]
    if job.get("publications"):
        summary["publications"] = [p["location"] for p in job["publications"]]
    click.echo(json.dumps(summary, indent=2), err=True)
