"""The publish stage: the job's registered artifacts copied to each destination of `spec.publish`.

    s3  every file under `s3://bucket/prefix/<name>` (multipart above 8 MiB, SHA-256 checksums checked by the
        store, object metadata: job id, target fingerprint, sha256), each verified by a HEAD afterwards;
        manifest.json goes last, so a listed manifest means a complete copy.
    hf  a private repo created if missing, the artifact folder uploaded in one commit (model card included);
        the commit sha is recorded on the job.

Every destination is judged by the scoping rule (domain/storage_scope.py) before anything is
copied anywhere: a destination inside Draftsmith's own storage is refused (only the service writes there), and
another bucket is written with the organisation's own secret (the destination's `credentials_secret`, else
`s3.<bucket>`, else `s3`), with the deployment's credentials only for DRAFTSMITH_S3_TRUSTED_BUCKETS; a Hub repo
with the destination's `token_secret`, else the organisation's `hf.<namespace>`, else `hf`, with the deployment's
token only for DRAFTSMITH_HF_TRUSTED_NAMESPACES, and never anonymously. Secrets are stored encrypted and
decrypted by the worker only (worker/sources.py `open_s3`, `hub_token`). They never appear in errors, events or
logs: a failure says which destination and what the service answered, and any text that could echo a credential
is scrubbed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from domain.artifacts import artifacts_of
from domain.models import Job
from schemas.job_folder import EXPORTED_DRAFTER_CONFIG, MANIFEST, DrafterConfigFile
from schemas.job_spec import HuggingFaceDestination, JobSpec, S3Destination
from schemas.lineage import DrafterRecord
from schemas.manifest import Manifest
from trainer.errors import DraftsmithError
from worker.context import WorkerContext
from worker.reporting import StageReporter
from worker.sources import Caller, StorageNotAllowed, hub_token, open_s3

MULTIPART_BYTES = 8 << 20


class PublishError(DraftsmithError):
    code = "publish_failed"


def publish_job(ctx: WorkerContext, job: Job, spec: JobSpec, reporter: StageReporter) -> dict:
    advice = announce_warm_start_advice(ctx, job, reporter)
    said = {} if advice is None else {"warm_start_advice": advice}
    if not spec.publish:
        return {"destinations": 0, **said}
    # Every destination judged (and its client built) before the first byte goes anywhere.
    caller = Caller(job.org_id, ctx.session_factory)
    s3_targets = {index: open_s3(destination.uri, ctx.settings, caller, what=f"publish[{index}]", write=True,
                                 explicit_secret=destination.credentials_secret)
                  for index, destination in enumerate(spec.publish) if isinstance(destination, S3Destination)}
    hub_tokens = {index: hub_token(destination.repo, ctx.settings, caller, what=f"publish[{index}]", write=True,
                                   explicit_secret=destination.token_secret)
                  for index, destination in enumerate(spec.publish) if isinstance(destination, HuggingFaceDestination)}
    folder = _artifacts_here(ctx, job.id, reporter)
    manifest = Manifest.load(folder / MANIFEST.path)
    fingerprint = _fingerprint(folder)
    for index, destination in enumerate(spec.publish):
        secrets: list[str] = []
        try:
            if isinstance(destination, S3Destination):
                target = s3_targets[index]
                secrets = target.scrub
                location, revision, url = _to_s3(target.client, target.bucket, target.key, job, destination, folder,
                                                 manifest, fingerprint)
            else:
                token = hub_tokens[index]
                assert token, "hub_token refuses a publish without a token (write=True)"
                secrets = [token]  # scrubbed from a failure's message
                location, revision, url = _to_hub(ctx, job, destination, folder, token)
        except (PublishError, StorageNotAllowed):
            raise
        except Exception as exc:  # a library error: name the destination, never the credential
            raise PublishError(f"publish[{index}] ({_describe(destination)}) failed: "
                               f"{_scrub(_explain(exc), secrets)}") from None
        reporter.record_publication(kind=destination.kind, location=location, revision=revision, url=url)
        reporter.progress("publish", (index + 1) / len(spec.publish), f"published to {location}")
    return {"destinations": len(spec.publish), **said}


def announce_warm_start_advice(ctx: WorkerContext, job: Job, reporter: StageReporter) -> str | None:
    """A warm-started job's advice (report.json `warm_start.advice`: keep_parent or serve_new, as the export's
    drafter-record.json carries it), said in an event before anything is published: a drafter whose gain over its
    parent is not shown is still published (it is lossless), but whoever rolls it out reads to keep serving the
    parent. None for a job without a parent."""
    stored = reporter.read_artifact(DrafterRecord.FILE)
    if stored is None:
        return None
    warm_start = DrafterRecord.read(json.loads(stored)).warm_start
    if warm_start is None or warm_start.advice is None:
        return None
    gain = warm_start.gain_sampled
    reporter.event(f"publish: warm start: {warm_start.advice_reason or warm_start.advice}",
                   level="warning" if warm_start.keep_parent else "info",
                   data={"advice": warm_start.advice, "parent_tau": warm_start.parent_tau, "tau": warm_start.tau,
                         "ratio": gain.ratio if gain else None, "ratio_ci95": gain.ci95 if gain else None})
    return warm_start.advice


def _artifacts_here(ctx: WorkerContext, job_id: str, reporter: StageReporter) -> Path:
    """The job's registered artifacts in a local folder (a CPU worker may not be the one that exported)."""
    folder = ctx.job_dir(job_id) / "publish"
    shutil.rmtree(folder, ignore_errors=True)
    rows = artifacts_of(reporter.session, job_id)
    if not any(row.name == "manifest.json" for row in rows):
        raise PublishError("the job has no exported manifest.json to publish; run the export stage first")
    for row in rows:
        ctx.storage.get_file(row.storage_key, folder / row.name)
    return folder


def _fingerprint(folder: Path) -> str:
    config = DrafterConfigFile.read(json.loads((folder / EXPORTED_DRAFTER_CONFIG.path).read_text()))
    return (config.draftsmith.target_fingerprint if config.draftsmith else None) or ""


def _to_s3(client, bucket: str, prefix: str, job: Job, destination: S3Destination, folder: Path,  # noqa: ANN001
           manifest: Manifest, fingerprint: str) -> tuple[str, str, str]:
    from boto3.s3.transfer import TransferConfig

    prefix = prefix.strip("/")
    transfer = TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES)
    for name in manifest.names():
        sha256 = manifest.files[name].sha256 if name in manifest.files else None
        key = f"{prefix}/{name}" if prefix else name
        extra = {"Metadata": {"draftsmith-job-id": job.id, "target-fingerprint": fingerprint,
                              **({"sha256": sha256} if sha256 else {})},
                 "ChecksumAlgorithm": "SHA256"}
        if not destination.private:
            extra["ACL"] = "public-read"
        client.upload_file(str(folder / name), bucket, key, ExtraArgs=extra, Config=transfer)
        head = client.head_object(Bucket=bucket, Key=key)
        if head["ContentLength"] != (folder / name).stat().st_size or \
                (sha256 and head.get("Metadata", {}).get("sha256") != sha256):
            raise PublishError(f"s3://{bucket}/{key} does not match what was uploaded (size or sha256 differ)")
    manifest_sha = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    location = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return location, manifest_sha, f"{location}/manifest.json"


def _to_hub(ctx: WorkerContext, job: Job, destination: HuggingFaceDestination, folder: Path,
            token: str) -> tuple[str, str, str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=ctx.settings.hf_endpoint, token=token)
    repo_url = api.create_repo(destination.repo, private=destination.private, exist_ok=True, repo_type="model")
    commit = api.upload_folder(repo_id=destination.repo, folder_path=folder, repo_type="model",
                               commit_message=f"Draftsmith job {job.id}: DFlash drafter",
                               commit_description="Trained, validated lossless and exported by Draftsmith.")
    return str(repo_url), commit.oid, commit.commit_url


def _describe(destination: S3Destination | HuggingFaceDestination) -> str:
    return destination.uri if isinstance(destination, S3Destination) else f"hf://{destination.repo}"


def _explain(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:  # botocore ClientError
        error = response["Error"]
        return f"S3 answered {error.get('Code', 'an error')}"
    status = getattr(response, "status_code", None)
    if status is not None:  # huggingface_hub HfHubHTTPError
        return f"the Hub answered HTTP {status}"
    return type(exc).__name__


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
