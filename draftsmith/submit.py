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


def _server_options(command):
    command = click.option("--api-key", envvar="DRAFTSMITH_API_KEY", default=None,
                           help="env DRAFTSMITH_API_KEY.")(command)
    return click.option("--url", envvar="DRAFTSMITH_URL", default="http://127.0.0.1:8000", show_default=True,
                        help="The server (env DRAFTSMITH_URL).")(command)


def _follow_options(command):
    command = click.option("--download", "download_dir", type=click.Path(path_type=Path), default=None,
                           help="After success, download every artifact here and verify it against the manifest "
                                "(implies --wait).")(command)
    return click.option("--wait", is_flag=True, help="Follow the job with a progress bar until it ends.")(command)


@click.command()
@_server_options
@click.option("--target", default=None, help="Target URI: bundled:NAME, hf://org/name[@rev], s3://..., file:///...")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="A job spec (JSON body of POST /v1/jobs); --target and --set override its fields.")
@click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
              help="Set a spec field, e.g. --set training.max_steps=50 --set drafter.block_size=16 (repeatable).")
@click.option("--from-drafter", "parent", default=None,
              help="Specialise this parent drafter instead of training from nothing: drf_ID (one of yours), "
                   "hf://org/name, s3://..., file:///... in any supported format (sets init.from_drafter).")
@click.option("--idempotency-key", default=None, help="Submitting again with the same key returns the same job.")
@_follow_options
def submit(url, api_key, target, spec_file, assignments, parent, idempotency_key, wait, download_dir) -> None:
    """Submit a drafter-training job; with --wait, exit 0 only if it succeeds."""
    body = json.loads(spec_file.read_text()) if spec_file else {}
    if target:
        body.setdefault("target", {})["uri"] = target
    if parent:
        body.setdefault("init", {})["from_drafter"] = parent
    for assignment in assignments:
        _set_field(body, assignment)
    if "target" not in body:
        raise click.UsageError("give --target URI or --spec FILE")
    _act(url, api_key, lambda client: client.create_job(body, idempotency_key=idempotency_key), wait, download_dir)


@click.command()
@_server_options
@click.argument("job_id")
@_follow_options
def resume(url, api_key, job_id, wait, download_dir) -> None:
    """Resume a failed or cancelled job from its last finished stage and checkpoint."""
    _act(url, api_key, lambda client: client.resume(job_id), wait, download_dir)


@click.command()
@_server_options
@click.argument("job_id")
def cancel(url, api_key, job_id) -> None:
    """Cancel a job (training stops at its next step, with a checkpoint; `draftsmith resume` continues it)."""
    _act(url, api_key, lambda client: client.cancel(job_id), False, None)


def _act(url, api_key, start, wait: bool, download_dir: Path | None) -> None:
    """Start something on the server (`start(client)` returns the job), then optionally follow it to the end."""
    from draftsmith.client import ApiError, Client, DownloadError, Unreachable

    with Client(url, api_key) as client:
        try:
            job = start(client)
            click.echo(f"job {job['id']} {job['status']}", err=True)
            if not (wait or download_dir):
                click.echo(job["id"])
                return
            job = client.wait(job["id"], on_event=_progress_printer())
            _report(job, client)
            if job["status"] == "succeeded" and download_dir:
                download_artifacts(client, job["id"], download_dir)
            # Last on stderr, as `draftsmith run` prints it last: the line a person acts on (e.g. "do not enable
            # this drafter on hardware like the validation machine"). stdout stays the job id alone.
            _echo_serving_advice(client, job)
            if job["status"] != "succeeded":  # 3: the lossless check failed (never serve it); 1: anything else
                sys.exit(3 if (job.get("error") or {}).get("code") == "not_lossless" else 1)
            click.echo(job["id"])
        except (ApiError, Unreachable) as error:
            raise click.ClickException(str(error)) from None
        except DownloadError as error:
            raise click.ClickException(f"download failed: {error}") from None


def _progress_printer():
    """An event callback drawing one progress bar per stage (rich), fed by the SSE stream."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    # The remaining time is rich's estimate from the stage's own progress rate.
    progress = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                        transient=False)
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


def _report(job: dict, client) -> None:
    summary = {"id": job["id"], "status": job["status"], "run_attempts": job.get("run_attempts"),
               "stages": {s["stage"]: s["status"] for s in job["stages"]}}
    if job.get("error"):
        summary["error"] = job["error"]
    if job.get("publications"):
        summary["publications"] = [p["location"] for p in job["publications"]]
    drafters = client.drafters(job_id=job["id"], limit=1) if job["status"] == "succeeded" else []
    if drafters:  # what the job made, as its validation measured it
        metrics = drafters[0].get("metrics") or {}
        summary.update({k: metrics.get(k) for k in ("tau", "speedup", "recommended_block_size", "lossless_passed")})
    click.echo(json.dumps(summary, indent=2), err=True)


def _echo_serving_advice(client, job: dict) -> None:
    """report.json's `serving_advice.summary`, the dashboard's red line, when validation wrote one."""
    from draftsmith.client import ApiError, DownloadError, Unreachable

    try:
        report = client.report(job["id"])
    except (ApiError, DownloadError, Unreachable, ValueError) as error:  # the outcome stands; only the advice is missing
        click.echo(f"serving advice unavailable: could not read report.json ({error})", err=True)
        return
    advice = report.serving_advice if report is not None else None
    if advice is not None and advice.summary:
        click.echo(advice.summary, err=True)


def download_artifacts(client, job_id: str, directory: Path) -> None:
    """Every artifact of the job into `directory`, each verified by its sha256 and the set by manifest.json
    (Client.download), with a progress bar of bytes on stderr; one line per file where stderr is no terminal.
    The one download of the CLI: `submit --download`, `resume --download` and `download` all come here."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from draftsmith.client import DownloadError

    artifacts = client.artifacts(job_id)
    if not artifacts:  # "0 artifacts verified" would read as success
        raise DownloadError(f"job {job_id} has no artifacts; nothing was downloaded")
    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        console=console, transient=False, disable=not console.is_terminal)
    total = progress.add_task("download", total=sum(a["size_bytes"] for a in artifacts))
    done: dict[str, int] = {}

    def on_progress(artifact: dict, size: int) -> None:
        done[artifact["name"]] = done.get(artifact["name"], 0) + size
        # The name is the server's: shown as text, never read as rich markup.
        progress.update(total, advance=size, description=escape(artifact["name"][-40:]))
        if not console.is_terminal and done[artifact["name"]] >= artifact["size_bytes"]:
            click.echo(f"downloaded {artifact['name']} ({artifact['size_bytes']} bytes)", err=True)

    with progress:
        client.download(job_id, directory, on_progress=on_progress)
    click.echo(verified_message(artifacts, directory), err=True)


def verified_message(artifacts: list[dict], directory: Path) -> str:
    """What a finished download proved, and no more: each file by its sha256, and the set by manifest.json only
    where the job listed one."""
    from draftsmith.client import lists_manifest

    count = f"{len(artifacts)} artifact{'s' if len(artifacts) != 1 else ''}"
    if lists_manifest(artifacts):
        return f"{count} verified in {directory}: each by its sha256, and the set by manifest.json"
    return (f"{count} verified in {directory}: each by its sha256; the job listed no manifest.json, so the set "
            "was not checked against one")
