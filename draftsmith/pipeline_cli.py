"""`draftsmith audit`, `draftsmith drafters`, `draftsmith usage`: the commands a fine-tune pipeline runs.

    draftsmith audit --drafter drf_01J... --target hf://acme/llama@v4 --url URL     # on the service
    draftsmith audit --drafter out/run1 --target /models/llama-v4                   # here, the same measurement

`audit` prints a summary on stderr and the recommendation (`keep`, `warm_start`, `retrain`) as the last line of
stdout (`--json`: the whole audit as JSON instead). Exit status: 0 the audit ran (whatever it recommends); 1 it
could not run (an unreachable checkpoint, bad input: the message says which); 3 the lossless check failed (never
serve that drafter with that target); 4 the drafter does not fit the target (hidden size, vocabulary or taps:
the message names the mismatch; a pipeline retrains).

Service mode when `--url` is given (or DRAFTSMITH_URL is set): the service fetches drf_ ids, hf://, s3:// and
uploaded files. Without it the audit runs here (`trainer.audit.run_audit`, what the worker runs), on a drafter
directory or exported artifact folder and a target directory or bundled name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from schemas.audit import AuditResult

EXIT_FAILED = 1
EXIT_NOT_LOSSLESS = 3
EXIT_INCOMPATIBLE = 4


def _client(url: str | None, api_key: str | None):
    from draftsmith.client import Client

    return Client(url, api_key)


def audit_result(audit: dict[str, Any]) -> AuditResult:
    """The result of an audit as the service answers it (under `result`) or as it ran here, read leniently."""
    from schemas.audit import AuditResult

    return AuditResult.read(audit.get("result") or audit)


def _echo_summary(audit: dict[str, Any], result: AuditResult) -> None:
    from schemas.audit import AuditLossless, AuditRecommendation, AuditReference
    from schemas.validation_report import GreedyCheck, SamplingTest

    rec, reference = result.recommendation or AuditRecommendation(), result.reference or AuditReference()
    lossless = result.lossless or AuditLossless()
    greedy, sampling = lossless.greedy or GreedyCheck(), lossless.sampling or SamplingTest()
    fingerprint = result.compatibility.fingerprint if result.compatibility else None
    same = {True: "unchanged", False: "changed"}.get(fingerprint.same, "unknown") if fingerprint else "unknown"
    p_value = "–" if sampling.p_value is None else f"{sampling.p_value:.3g}"
    lines = [
        f"drafter:        {audit.get('drafter', '')}",
        f"target:         {audit.get('target_uri', '')} (fingerprint {same})",
        f"lossless:       {'passed' if result.passed else 'FAILED'} (greedy mismatches {greedy.mismatches}, "
        f"sampling p = {p_value})",
        f"tau:            {result.tau} on {result.prompts} prompts"
        + (f" (reference {reference.tau}, delta {reference.delta:+.3f})"
           if reference.tau is not None and reference.delta is not None else ""),
        f"per position:   {result.tau_per_position}",
        "by category:    " + ", ".join(f"{k} {v.tau}" for k, v in (result.acceptance_by_category or {}).items()),
        f"recommendation: {rec.action} ({rec.reason})",
    ]
    click.echo("\n".join(lines), err=True)


@click.command()
@click.option("--drafter", required=True, help="drf_... (service), or a drafter directory / artifact folder / URI.")
@click.option("--target", required=True, help="The (new) checkpoint: a directory, bundled name, or URI.")
@click.option("--prompts", default=None, help="builtin, file-... (service), or a JSONL/URI; default: the "
              "drafter's job's (service) or builtin. Its hold-out is measured.")
@click.option("--count", type=int, default=None, help="Prompts drawn from the source, hold-out included.")
@click.option("--holdout", type=float, default=None, help="Hold-out share of the source.")
@click.option("--num-prompts", type=int, default=None, help="Held-out prompts measured (default 24).")
@click.option("--max-new-tokens", type=int, default=None, help="Tokens decoded per prompt (default 96).")
@click.option("--sampling-draws", type=int, default=None, help="Draws of the sampling test (default 300).")
@click.option("--temperature", type=float, default=None, help="Sampling parameters (default: the drafter's job's, "
              "else greedy).")
@click.option("--top-p", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--keep-min-gain-ratio", type=float, default=None)
@click.option("--warm-start-min-gain-ratio", type=float, default=None)
@click.option("--min-tau", type=float, default=None)
@click.option("--reference-tau", type=float, default=None, help="The drafter's tau on its own target (default: "
              "recorded, or a report.json beside the drafter).")
@click.option("--url", envvar="DRAFTSMITH_URL", default=None, help="Audit on this server (env DRAFTSMITH_URL).")
@click.option("--api-key", envvar="DRAFTSMITH_API_KEY", default=None)
@click.option("--local", is_flag=True, help="Run here even when DRAFTSMITH_URL is set.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole audit as JSON on stdout.")
@click.option("--timeout", type=float, default=3600, show_default=True, help="Seconds to wait for the service.")
def audit(drafter, target, prompts, count, holdout, num_prompts, max_new_tokens, sampling_draws, temperature, top_p,
          top_k, keep_min_gain_ratio, warm_start_min_gain_ratio, min_tau, reference_tau, url, api_key, local,
          as_json, timeout) -> None:
    """Measure a drafter against a (new) target checkpoint and recommend keep, warm_start or retrain."""
    # A drafter directory on this disk travels as its file:// URI (the spec takes URIs and drf_ ids only).
    if Path(drafter).exists():
        drafter = Path(drafter).resolve().as_uri()
    body: dict = {"drafter": drafter, "target": {"uri": _target_uri(target, local or not url)}}
    sections = {
        "data": {"source": _source(prompts, local or not url) if prompts else None, "count": count,
                 "holdout_share": holdout},
        "validation": {"prompts": num_prompts, "max_new_tokens": max_new_tokens, "sampling_draws": sampling_draws},
        "sampling": {"temperature": temperature, "top_p": top_p, "top_k": top_k},
        "thresholds": {"keep_min_gain_ratio": keep_min_gain_ratio,
                       "warm_start_min_gain_ratio": warm_start_min_gain_ratio, "min_tau": min_tau},
    }
    for name, values in sections.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            body[name] = given
    if reference_tau is not None:
        body["reference_tau"] = reference_tau
    if url and not local:
        result = _audit_on_service(body, url, api_key, timeout)
    else:
        result = _audit_here(body)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    report = audit_result(result)
    _echo_summary(result, report)
    if not as_json:
        click.echo(report.action)
    if not report.passed:
        click.echo("error: the lossless check failed: do not serve this drafter with this target", err=True)
        sys.exit(EXIT_NOT_LOSSLESS)


def _target_uri(target: str, local: bool) -> str:
    from trainer.cli_run import target_uri

    return target_uri(target) if local or Path(target).exists() else target


def _source(prompts: str, local: bool) -> str:
    if prompts == "builtin" or prompts.startswith(("file-", "hf://", "s3://", "file://")):
        return prompts
    return Path(prompts).resolve().as_uri()


def _audit_on_service(body: dict, url: str, api_key: str | None, timeout: float) -> dict:
    from draftsmith.client import ApiError

    with _client(url, api_key) as client:
        try:
            created = client.create_audit(body)
            click.echo(f"audit {created['id']} queued", err=True)
            done = client.wait_audit(created["id"], timeout=timeout)
        except ApiError as error:
            raise click.ClickException(str(error)) from None
        except TimeoutError as error:
            raise click.ClickException(str(error)) from None
    if done["status"] == "failed":
        error = done["error"] or {}
        click.echo(f"error: audit {done['id']} failed ({error.get('code')}): {error.get('message')}", err=True)
        sys.exit(EXIT_INCOMPATIBLE if error.get("code") == "incompatible_drafter" else EXIT_FAILED)
    return done


def _audit_here(body: dict) -> dict:
    from pydantic import ValidationError

    from schemas.audit import AuditSpec, resolved
    from trainer.audit import run_audit
    from trainer.cli_run import local_path
    from trainer.errors import DraftsmithError

    try:
        spec = resolved(AuditSpec.model_validate(body, context={"allowed_file_roots": ["/"]}))
    except ValidationError as exc:
        error = exc.errors()[0]
        raise click.ClickException(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}") from None
    try:
        if spec.drafter.startswith(("drf_", "hf://", "s3://")):
            raise DraftsmithError(f"--drafter {spec.drafter} is fetched by the service: give --url (or a local "
                                  "drafter directory)")
        drafter = local_path(spec.drafter, "drafter") if spec.drafter.startswith("file://") else spec.drafter
        assert spec.data is not None
        report = run_audit(spec, target=local_path(spec.target.uri, "target"), drafter=drafter,
                           prompts=local_path(spec.data.source, "prompts file"),
                           base=local_path(spec.target.base, "base model") if spec.target.base else None)
    except DraftsmithError as error:
        click.echo(f"error: {error.code}: {error}", err=True)
        sys.exit(EXIT_INCOMPATIBLE if error.code == "incompatible_drafter" else EXIT_FAILED)
    return {"drafter": body["drafter"], "target_uri": spec.target.uri, "status": "succeeded",
            "result": report.to_json()}


@click.group()
def drafters() -> None:
    """Published drafters and their lineage (on a server)."""


def _service_options(command):
    command = click.option("--api-key", envvar="DRAFTSMITH_API_KEY", default=None)(command)
    return click.option("--url", envvar="DRAFTSMITH_URL", default="http://127.0.0.1:8000", show_default=True)(command)


@drafters.command("list")
@_service_options
@click.option("--job-id", default=None, help="The drafter a job published.")
@click.option("--target-uri", default=None)
@click.option("--limit", default=20, show_default=True)
def drafters_list(url, api_key, job_id, target_uri, limit) -> None:
    """List drafters as JSON, newest first."""
    from draftsmith.client import ApiError

    with _client(url, api_key) as client:
        try:
            click.echo(json.dumps(client.drafters(job_id=job_id, target_uri=target_uri, limit=limit), indent=2))
        except ApiError as error:
            raise click.ClickException(str(error)) from None


@drafters.command("show")
@_service_options
@click.argument("drafter_id")
def drafters_show(url, api_key, drafter_id) -> None:
    """One drafter with its lineage and chain of parents, as JSON."""
    from draftsmith.client import ApiError

    with _client(url, api_key) as client:
        try:
            click.echo(json.dumps(client.drafter(drafter_id), indent=2))
        except ApiError as error:
            raise click.ClickException(str(error)) from None


@click.command()
@_service_options
@click.option("--period", default=None, help="YYYY-MM; default this month.")
def usage(url, api_key, period) -> None:
    """This month's compute seconds and tokens, and the organisation's quotas, as JSON."""
    from draftsmith.client import ApiError

    with _client(url, api_key) as client:
        try:
            click.echo(json.dumps(client.usage(period), indent=2))
        except ApiError as error:
            raise click.ClickException(str(error)) from None
