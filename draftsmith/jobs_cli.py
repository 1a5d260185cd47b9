"""`draftsmith jobs` and `draftsmith download`: what is on the server, and an existing job's artifacts.

    draftsmith jobs                                   # newest first: id, status, stage and its progress, name
    draftsmith jobs --status failed --label team:search --limit 50
    draftsmith jobs --json                            # the jobs as GET /v1/jobs returns them, one JSON list
    draftsmith download job_01J... --out drafter/     # every artifact, each verified by its sha256

The filters are GET /v1/jobs's own: `--status` repeatable (any of), `--label key:value` repeatable (all of).
`download` is the download of `submit --download` (draftsmith/submit.py download_artifacts): the same checks
against each artifact's recorded sha256 and manifest.json, the same progress bar. Exit 1 with one line naming
the problem when the server refuses (an unknown job is 404), the job has not succeeded (its status and stage, and
what to run instead), an artifact's name would land outside --out, or a file fails verification.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from draftsmith.submit import _server_options, download_artifacts

PAGE = 100  # the API's largest page


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, label = value.partition(":")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: use KEY:VALUE, e.g. --label team:search", param_hint="--label")
        labels[key] = label
    return labels


@click.command()
@_server_options
# No click.Choice: the API owns the list of states, and its 422 names `status` and lists them.
@click.option("--status", "statuses", multiple=True, metavar="STATE",
              help="Only jobs in this state, e.g. failed (repeatable: any of them).")
@click.option("--label", "labels", multiple=True, metavar="KEY:VALUE",
              help="Only jobs carrying this label (repeatable: all of them).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=20, show_default=True, help="At most this many jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON (a list, as GET /v1/jobs has them).")
def jobs(url, api_key, statuses, labels, limit, as_json) -> None:
    """List jobs, newest first: status, stage and its progress."""
    from draftsmith.client import ApiError, Client, Unreachable

    wanted = _labels(labels)
    found: list[dict] = []
    with Client(url, api_key) as client:
        try:
            after = None
            while len(found) < limit:  # follow next_cursor for a --limit beyond one page
                page = client.jobs(status=statuses, labels=wanted, limit=min(PAGE, limit - len(found)), after=after)
                found += page["data"]
                after = page["next_cursor"]
                if not page["has_more"] or not after:
                    break
        except (ApiError, Unreachable) as error:
            raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("no jobs" + (" match those filters" if statuses or labels else " yet"), err=True)
        return
    rows = [("ID", "STATUS", "STAGE", "PROGRESS", "CREATED", "NAME")] + [_row(job) for job in found]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _row(job: dict) -> tuple[str, ...]:
    progress = job.get("stage_progress")
    error = (job.get("error") or {}).get("code")
    # The server's words for the status ("waiting for a worker"), where it sends them.
    status = job.get("status_text") or job["status"]
    return (job["id"], status + (f" ({error})" if error else ""), job.get("stage") or "-",
            "-" if progress is None else f"{progress:.0f}%", job["created_at"][:19].replace("T", " "),
            job.get("name") or "")


@click.command()
@_server_options
@click.argument("job_id")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory to write into (default: ./JOB_ID).")
def download(url, api_key, job_id, out_dir) -> None:
    """Download every artifact of a job, each verified by its sha256 (and the set by manifest.json where the job lists
    one)."""
    from draftsmith.client import ApiError, Client, DownloadError, Unreachable

    directory = out_dir or Path(job_id)
    with Client(url, api_key) as client:
        try:
            job = client.job(job_id)
            if job["status"] != "succeeded":
                raise click.ClickException(_not_finished(job, directory))
            download_artifacts(client, job_id, directory)
        except (ApiError, Unreachable) as error:
            raise click.ClickException(str(error)) from None
        except DownloadError as error:
            raise click.ClickException(f"download failed: {error}") from None
    click.echo(str(directory))


def _not_finished(job: dict, directory: Path) -> str:
    """Why a job that has not succeeded has nothing to download, and what to run instead."""
    job_id, status, stage, progress = job["id"], job["status"], job.get("stage"), job.get("stage_progress")
    code = (job.get("error") or {}).get("code")
    percent = [f"{progress:.0f}%"] if isinstance(progress, int | float) else []
    where = ", ".join(([f"stage {stage}"] if stage else []) + percent + ([f"error {code}"] if code else []))
    state = {"failed": "failed", "cancelled": "was cancelled"}.get(status, f"is {job.get('status_text') or status}")
    resume = f"`draftsmith resume {job_id} --download {directory}` runs it on from its last finished stage"
    if status in ("failed", "cancelled"):
        advice = f"it made nothing to download; {resume} and downloads what it makes"
    elif status == "cancelling":
        advice = f"nothing to download; once it is cancelled, {resume}"
    else:
        advice = (f"nothing to download yet; run `draftsmith download {job_id}` again once `draftsmith jobs` shows it "
                  "succeeded")
    return f"job {job_id} {state}{f' ({where})' if where else ''}: {advice}"
