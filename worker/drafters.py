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
it came from (domain/drafters.py): the pinned target and prompts revisions, the data snapshot, the parent, the
recipe, code and package versions, and the validation metrics.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from domain.artifacts import artifact_named, artifacts_of
from domain.drafters import published_drafter
from domain.models import Job
from domain.settings import Settings
from schemas.job_spec import DRAFTER_ID_RE, JobSpec
from schemas.validation_report import ValidationReport
from trainer.drafter.checkpoint import drafter_folder, drafter_prefix
from trainer.errors import DraftsmithError
from worker.reporting import JobRecords
from worker.sources import (PRIVATE_BUCKET_HINT, Caller, Resolved, StorageNotAllowed, _fetch_hub, fetch_cache,
                            local_file, open_s3)

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
    id. Reads the job's work files from object storage (this may be a CPU worker that ran none of the other
    stages)."""
    session = records.session
    prefix = f"jobs/{job.id}/work"

    def work(name: str) -> dict:
        key = f"{prefix}/{name}"
        return json.loads(_read(ctx, key)) if ctx.storage.exists(key) else {}

    sources, prepared = work("sources.json"), work("prepare.json")
    report = ValidationReport.read(work("report.json"))
    generated, trained = work("stages/generate.json"), work("stages/train.json")
    manifest = artifact_named(session, job.id, "manifest.json")
    config = artifact_named(session, job.id, "drafter/config.json")
    if manifest is None or config is None:
        raise DraftsmithError("the job has no exported manifest.json and drafter/config.json to record")
    manifest_bytes = _read(ctx, manifest.storage_key)
    drafter_config = json.loads(_read(ctx, config.storage_key))
    dflash = drafter_config.get("dflash_config", {})
    data_keys = ctx.storage.list_keys(f"{prefix}/data")
    serving_block = report.recommended_block_size or drafter_config.get("block_size")
    categories = report.acceptance_by_category
    metrics = {
        "tau": report.tau, "tau_per_position": report.tau_per_position,
        "acceptance_by_category": None if categories is None else {k: c.to_json() for k, c in categories.items()},
        "oracle_tau": report.oracle_tau,
        "lossless_passed": bool(report.passed),
        "greedy_mismatches": report.greedy.mismatches,
        "sampling_p_value": report.sampling.p_value,
        "recommended_block_size": report.recommended_block_size,
        "speedup": report.speedup.ratio if report.speedup else None,
        "parent_tau": report.warm_start.parent_tau if report.warm_start else None,
        "serving": {"sglang": f"--speculative-algorithm DFLASH --speculative-num-draft-tokens {serving_block}",
                    "vllm": {"method": "dflash", "num_speculative_tokens": serving_block - 1},
                    "llama_cpp": f"--spec-type draft-dflash --spec-draft-n-max {serving_block - 1}"},
    }
    lineage = {
        "target": {"uri": spec.target.uri, **(sources.get("target") or {})},
        "data": {
            "source": spec.data.source, "source_revision": (sources.get("prompts") or {}).get("revision"),
            "count": spec.data.count, "holdout_share": spec.data.holdout_share,
            "train_prompts": prepared.get("train_prompts"), "holdout_prompts": prepared.get("holdout_prompts"),
            "examples": generated.get("examples"), "response_tokens": generated.get("response_tokens"),
            "snapshot": {"location": f"{prefix}/data", "files": len(data_keys),
                         "digest": hashlib.sha256(json.dumps(sorted(data_keys.items())).encode()).hexdigest()},
        },
        "parent": {"ref": spec.init.from_drafter, **(sources.get("init") or {}),
                   "tau_on_this_target": metrics["parent_tau"]} if spec.init else None,
        "recipe": {name: getattr(spec, name).model_dump(mode="json")
                   for name in ("drafter", "training", "sampling", "validation")},
        "code": trained.get("environment") or {},
        "training": {k: trained.get(k) for k in ("steps", "final_loss", "train_tau_estimate")},
    }
    config = {"hidden_size": drafter_config.get("hidden_size"), "vocab_size": drafter_config.get("vocab_size"),
              "num_target_layers": drafter_config.get("num_target_layers"),
              "target_layer_ids": dflash.get("target_layer_ids"), "mask_token_id": dflash.get("mask_token_id"),
              "architecture": (drafter_config.get("architectures") or [None])[0]}
    return records.record_drafter(
        target_revision=(sources.get("target") or {}).get("revision"),
        target_fingerprint=prepared.get("fingerprint") or report.target_fingerprint or "",
        config=config, metrics=metrics, lineage=lineage,
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest())


def _read(ctx, key: str) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "file"
        ctx.storage.get_file(key, path)
        return path.read_bytes()
