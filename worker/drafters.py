"""Drafters as inputs and outputs of the service.

Input: `resolve_drafter` turns a drafter reference (a warm start's `init.from_drafter`, an audit's `drafter`) into
a local directory, like worker/sources.py does for targets:

    drf_...              one of the organisation's published drafters: its job's artifacts in object storage
    hf://org/name[@rev]  a Hub repo holding a drafter (at its root, or under drafter/ as Draftsmith publishes), read
                         with the organisation's own Hub token (worker/sources.py hub_token)
    s3://bucket/prefix   the same in a bucket (judged by the scoping rule before it is read: worker/sources.py)
    file:///path         below the allowed roots, after resolving symlinks

A report.json beside the drafter comes along when there is one (its tau is an audit's reference).

Output: `record_lineage` runs at the end of the publish stage and records the job's drafter with everything
it came from (domain/drafters.py): its shape, validation metrics and serving flags as the export wrote them
(drafter-record.json), the pinned target and prompts revisions, the data snapshot, the parent, the recipe, code
and package versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from domain.artifacts import artifacts_of
from domain.drafters import published_drafter
from domain.models import Job
from domain.settings import Settings
from schemas.job_folder import EXPORTED_DRAFTER_CONFIG, MANIFEST, PREPARED, REPORT, SOURCES, STAGE_MARKER
from schemas.job_spec import DRAFTER_ID_RE, JobSpec
from schemas.lineage import (
    DataLineage,
    DataSnapshot,
    DrafterLineage,
    DrafterRecord,
    ParentLineage,
    TrainingLineage,
)
from schemas.stages import Stage
from schemas.validation_report import WarmStart
from schemas.work_files import CodeEnvironment, PinnedSource, PinnedSources, PreparedTarget, StageMarker
from trainer.drafter.checkpoint import drafter_folder, drafter_prefix
from trainer.errors import DraftsmithError
from worker.reporting import JobRecords
from worker.sources import (
    PRIVATE_BUCKET_HINT,
    Caller,
    Resolved,
    StorageNotAllowed,
    _fetch_hub,
    fetch_cache,
    local_file,
    open_s3,
)
from worker.sync import job_work

DRAFTER_FILES = ("config.json", "*.safetensors", "report.json", "drafter/config.json", "drafter/*.safetensors")


class DrafterNotFound(DraftsmithError):
    code = "drafter_not_found"


def resolve_drafter(reference: str, ctx, org_id: str) -> Resolved:
    """A local directory holding the drafter (config.json + weights), and the version fetched."""
    cache = ctx.cache / "drafters"
    caller = Caller(org_id, ctx.session_factory)
    if DRAFTER_ID_RE.match(reference):
        return _published(reference, ctx, org_id, fetch_cache(cache, caller, "published", reference))
    if reference.startswith("file:"):
        path = Path(local_file(reference, ctx.settings, "drafter", caller))
        return Resolved(_drafter_dir(path, reference))
    if reference.startswith("hf://"):
        try:  # with the organisation's own token, or the deployment's for a trusted namespace (worker/sources.py)
            fetched = _fetch_hub(reference, ctx.settings, cache, DRAFTER_FILES, repo_type="model", caller=caller,
                                 what="drafter")
        except StorageNotAllowed:
            raise
        except DraftsmithError as error:
            raise DrafterNotFound(str(error)) from None
        return Resolved(_drafter_dir(Path(fetched.path), reference), fetched.revision)
    if reference.startswith("s3://"):
        return _from_s3(reference, ctx.settings, cache, caller)
    raise DrafterNotFound(f"drafter {reference!r}: give a drafter id (drf_...) or an hf://, s3:// or file:// URI")


def _drafter_dir(path: Path, reference: str) -> str:
    """The drafter the folder holds (trainer/drafter/checkpoint.py `drafter_folder`), or DrafterNotFound."""
    folder = drafter_folder(path)
    if folder is not None:
        return str(folder)
    raise DrafterNotFound(f"drafter {reference}: no config.json and *.safetensors there (nor under drafter/); give a "
                          "drafter directory or an exported artifact folder")


def _published(drafter_id: str, ctx, org_id: str, local: Path) -> Resolved:
    with ctx.session_factory() as session:
        row = published_drafter(session, org_id, drafter_id)
        if row is None:
            raise DrafterNotFound(f"no drafter {drafter_id!r} in the organisation")
        artifacts = {a.name: (a.storage_key, a.sha256) for a in artifacts_of(session, row.job_id)}
        manifest_sha = row.manifest_sha256
    wanted = {name: entry for name, entry in artifacts.items()
              if name.startswith("drafter/") or name == "report.json"}
    if "drafter/config.json" not in wanted:
        raise DrafterNotFound(f"drafter {drafter_id}: its artifacts hold no drafter/config.json")
    for name, (key, sha256) in wanted.items():
        path = local / name
        if not (path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256):
            ctx.storage.get_file(key, path)
    return Resolved(str(local / "drafter"), manifest_sha)


def _from_s3(uri: str, settings: Settings, cache: Path, caller: Caller) -> Resolved:
    from botocore.exceptions import BotoCoreError, ClientError

    handle = open_s3(uri, settings, caller, what="drafter")
    client, bucket, prefix = handle.client, handle.bucket, handle.key.strip("/")
    try:
        keys = {item["Key"][len(prefix) + 1 if prefix else 0:]: item for page in
                client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "")
                for item in page.get("Contents", [])}
        nested = drafter_prefix(keys)  # the rule drafter_folder applies to a local folder
        if nested is None:
            raise DrafterNotFound(f"drafter {uri}: no config.json and *.safetensors under this prefix (nor under "
                                  "drafter/)")
        wanted = [name for name in keys if name in (f"{nested}config.json", "report.json")
                  or (name.startswith(nested) and name.endswith(".safetensors") and "/" not in name[len(nested):])]
        revision = hashlib.sha256("".join(sorted(n + keys[n]["ETag"] for n in wanted)).encode()).hexdigest()[:16]
        local = fetch_cache(cache, caller, "s3", handle.identity, uri) / revision
        for name in wanted:
            path = local / name
            if not (path.is_file() and path.stat().st_size == keys[name]["Size"]):
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, f"{prefix}/{name}" if prefix else name, str(path))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise DrafterNotFound(f"drafter {uri}: S3 answered {code}; {PRIVATE_BUCKET_HINT}") from None
    except BotoCoreError as exc:
        raise DrafterNotFound(f"drafter {uri}: S3 is unreachable ({type(exc).__name__})") from None
    return Resolved(str(local / nested.rstrip("/")) if nested else str(local), revision)


# --- lineage, at the end of the publish stage ---------------------------------------------------------------


def record_lineage(ctx, job: Job, spec: JobSpec, records: JobRecords) -> str:
    """Record the job's drafter and what it came from, through the publish stage's `records`; returns the drafter
    id. The drafter's shape, metrics and serving flags are the export's drafter-record.json as written
    (schemas/lineage.py `DrafterRecord`); the rest of the lineage comes from the job's work files in object storage
    (this may be a CPU worker that ran none of the other stages), each through its model (schemas/work_files.py): a
    file missing or a field that does not fit leaves that part of the lineage empty, never the drafter unrecorded."""
    work_files = job_work(ctx.storage, job.id, ctx.job_dir(job.id))

    def work(name: str) -> dict[str, Any]:
        stored = work_files.read(name)
        return json.loads(stored) if stored is not None else {}

    sources, prepared = PinnedSources.read(work(SOURCES.path)), PreparedTarget.read(work(PREPARED.path))
    generated = StageMarker.read(work(STAGE_MARKER.name(stage=Stage.GENERATE)))
    trained = StageMarker.read(work(STAGE_MARKER.name(stage=Stage.TRAIN)))
    manifest_bytes = records.read_artifact(MANIFEST.path)
    if manifest_bytes is None:
        raise DraftsmithError("the job has no exported manifest.json to record")
    record = _drafter_record(records, work)
    data = DataLineage(
        source=spec.data.source, source_revision=sources.prompts.revision if sources.prompts else None,
        count=spec.data.count, holdout_share=spec.data.holdout_share,
        train_prompts=prepared.train_prompts, holdout_prompts=prepared.holdout_prompts,
        examples=generated.examples, response_tokens=generated.response_tokens,
        snapshot=_snapshot(work_files.remote("data"), work_files.prefix))
    pinned = sources.target or PinnedSource()
    lineage = DrafterLineage.written(
        target=PinnedSource(uri=spec.target.uri, revision=pinned.revision, pinned_uri=pinned.pinned_uri),
        data=data, parent=_parent(spec, sources.init, record.warm_start),
        recipe={name: getattr(spec, name).model_dump(mode="json")
                for name in ("drafter", "training", "sampling", "validation")},
        code=trained.environment or CodeEnvironment(),
        training=TrainingLineage(steps=trained.steps, final_loss=trained.final_loss,
                                 train_tau_estimate=trained.train_tau_estimate))
    return records.record_drafter(
        target_revision=pinned.revision,
        target_fingerprint=prepared.fingerprint or record.target_fingerprint or "",
        config=record.shape, metrics=record.metrics, lineage=lineage,
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest())


def _drafter_record(records: JobRecords, work: Callable[[str], dict[str, Any]]) -> DrafterRecord:
    """The export's drafter-record.json, read as written (a record that does not fit its model is the export's bug,
    and fails the publish stage naming it)."""
    stored = records.read_artifact(DrafterRecord.FILE)
    if stored is not None:
        try:
            return DrafterRecord.read(json.loads(stored))
        except ValidationError as error:
            raise DraftsmithError(f"the job's {DrafterRecord.FILE} does not fit its model: {error}") from None
    # Fallback, kept for the jobs in flight across the release that added the record: export and publish are stages
    # of their own, so a job exported by the older release (its export marker stored) can be published by this one,
    # after a deploy or a retried destination, and its export wrote no record and will not run again. Its record is
    # built from the files that export did write, by the export's own rule (trainer/export/record.py), so nothing
    # is derived here. Delete this once no job exported before drafter-record.json remains unpublished.
    from trainer.export import record_of_export

    config = records.read_artifact(EXPORTED_DRAFTER_CONFIG.path)
    if config is None:
        raise DraftsmithError(f"the job has no exported {DrafterRecord.FILE} (nor drafter/config.json) to record")
    return record_of_export(json.loads(config), work(REPORT.path))


def _parent(spec: JobSpec, pinned: PinnedSource | None, warm_start: WarmStart | None) -> ParentLineage | None:
    """The parent as fetched, with what validation measured against it (report.json's warm_start, embedded as
    written: its origin, the paired gain at the job's parameters, the advice that follows from it and, for a drafter
    adapter job, the adapter's size)."""
    if spec.init is None:
        return None
    fetched, measured = pinned or PinnedSource(), warm_start or WarmStart()
    parent = ParentLineage(ref=spec.init.from_drafter, uri=fetched.uri, revision=fetched.revision,
                           pinned_uri=fetched.pinned_uri, tau_on_this_target=measured.parent_tau,
                           origin=measured.parent, gain=measured.gain_sampled, advice=measured.advice)
    if measured.adapter is not None:  # a drafter adapter job's record alone carries the key
        parent.adapter = measured.adapter
    return parent


def _snapshot(data_files: dict[str, int], prefix: str) -> DataSnapshot:
    """The stored data set (`data_files`: {path below the work folder: size}, the work folder at key `prefix`):
    its files' keys and sizes, digested."""
    keys = {f"{prefix}/{relative}": size for relative, size in data_files.items()}
    digest = hashlib.sha256(json.dumps(sorted(keys.items())).encode()).hexdigest()
    return DataSnapshot(location=f"{prefix}/data", files=len(keys), digest=digest)
