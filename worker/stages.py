"""One stage of one job on this worker: fetch its inputs from object storage, run it, put its outputs back.

The ML work itself is `trainer.pipeline.run_stage`, the same call `draftsmith run` makes; this module only
supplies what the service adds around it: the job's URIs fetched to local files (pinned at prepare, so a
Hub branch that moves mid-job cannot change the target under later stages), the job's work files mirrored
to `jobs/<id>/work/` as they are written, the exported files registered as the job's artifacts, and a
`stages/<stage>.json` marker stored last, so a stage whose output is already complete is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import mimetypes
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from domain.jobs import load_stored_spec
from domain.models import Job
from schemas.job_folder import MANIFEST, PREPARED, REPORT, SOURCES, STAGE_MARKER, STEP_RECORDS
from schemas.job_spec import JobSpec
from schemas.manifest import Manifest
from schemas.stages import Stage
from schemas.work_files import StageMarker
from trainer.errors import DraftsmithError
from trainer.lineage import environment
from trainer.pipeline import StageHooks, run_stage
from worker.context import WorkerContext
from worker.drafters import record_lineage
from worker.job_files import JobFiles, job_run_config, launch_for
from worker.reporting import StageReporter
from worker.shards import SendHelpers, ShardClaims
from worker.usage import StageUsage

# What each trainer stage reads, relative to the job's work directory (the files' paths: schemas/job_folder.py).
_PINNED = (SOURCES.path, PREPARED.path)
STAGE_INPUTS: dict[Stage, tuple[str, ...]] = {
    Stage.PREPARE: (),
    Stage.GENERATE: (*_PINNED, "data"),
    Stage.TRAIN: (*_PINNED, "data", "train"),
    # train/drafter-adapter: a drafter adapter job's PEFT adapter beside the merged drafter (absent for any other job).
    Stage.VALIDATE: (*_PINNED, "train/drafter", "train/drafter-adapter"),
    Stage.EXPORT: (*_PINNED, "train/drafter", "train/drafter-adapter", STEP_RECORDS.path, REPORT.path),
}
ARTIFACT_KINDS = {".safetensors": "safetensors", ".gguf": "gguf", ".jsonl": "metrics", ".html": "report-html"}
NAMED_KINDS = {"README.md": "model-card", "report.json": "report", "manifest.json": "manifest", "config.json": "config",
               "drafter-record.json": "drafter-record"}


def execute_stage(ctx: WorkerContext, job: Job, stage: Stage, reporter: StageReporter,
                  send_helpers: SendHelpers | None = None) -> dict:
    """Run `stage` of `job` here; return its summary. Raises what the stage raises (DraftsmithError with a code,
    StageInterrupted on cancellation, infrastructure errors for the caller to retry). The attempt's compute
    seconds and tokens count towards the organisation's usage (worker/usage.py), however it ends."""
    with StageUsage(ctx, job, stage) as usage:
        info = _execute_stage(ctx, job, stage, reporter, send_helpers)
        usage.tokens_from(info)
        return info


def _execute_stage(ctx: WorkerContext, job: Job, stage: Stage, reporter: StageReporter,
                   send_helpers: SendHelpers | None) -> dict:
    files = JobFiles(ctx, job.id)
    marker = STAGE_MARKER.name(stage=stage)
    if files.sync.has(marker):
        files.sync.pull(marker)
        reporter.event(f"{stage}: its output is already complete in storage; not running it again")
        return {**StageMarker.load(files.work / marker).summary(), "reused": True}
    spec = load_stored_spec(job.spec)
    if stage is Stage.PUBLISH:
        from worker.publish import publish_job

        info = publish_job(ctx, job, spec, reporter)
        # The drafter, with its lineage, becomes one of the organisation's published drafters (GET /v1/drafters).
        info["drafter_id"] = record_lineage(ctx, job, spec, reporter)
    else:
        with worker_cache_paths_hidden(ctx):
            info = _run_trainer_stage(ctx, job, stage, reporter, send_helpers, files, spec)
    # A summary's own keys are kept as they are; anything not JSON is written as its text, as it always was.
    stored = StageMarker.written(**info).model_dump(mode="json", exclude_unset=True, fallback=str)
    files.sync.put_bytes(marker, json.dumps(stored).encode())
    return info


@contextmanager
def worker_cache_paths_hidden(ctx: WorkerContext) -> Iterator[None]:
    """A refusal's message never shows this worker's copy of a job's files: the cache path holds the organisation's
    id and this machine's layout. Messages name what the job named (its URIs) where they can; a path into the cache
    becomes a phrase. The error keeps its class and code."""
    try:
        yield
    except DraftsmithError as error:
        cache = str(ctx.cache)
        if cache in str(error):
            error.args = (re.sub(re.escape(cache) + r"[^\s:;,)'\"]*", "(the job's copy on the worker)", str(error)),)
        raise


def _run_trainer_stage(ctx: WorkerContext, job: Job, stage: Stage, reporter: StageReporter,
                       send_helpers: SendHelpers | None, files: JobFiles, spec: JobSpec) -> dict:
    files.sync.pull(*STAGE_INPUTS[stage])
    latest = files.layout.train / "checkpoints" / "latest"
    if stage is Stage.TRAIN and latest.is_file():
        checkpoint = latest.read_text().strip()
        reporter.event(f"resuming training from checkpoint {checkpoint}", data={"checkpoint": checkpoint})
        # The series must hold every step once: steps the lost attempt trained up to its checkpoint but had
        # not yet written to the database come back from the checkpoint's metrics.jsonl.
        reporter.restore_metrics(files.layout.train / "metrics.jsonl", int(checkpoint.removeprefix("step-")))
    config = job_run_config(ctx, job, spec, files, reporter, pin=stage is Stage.PREPARE,
                            should_stop=reporter.should_stop)
    hooks = StageHooks(progress=reporter.progress, should_stop=reporter.should_stop, on_saved=files.sync.push,
                       on_metrics=reporter.metrics)
    if stage is Stage.GENERATE and ctx.settings.worker_generate_workers > 1:
        info = _generate_with_helpers(ctx, job, config, files, hooks, reporter, send_helpers)
    else:
        info = run_stage(stage, config, files.layout, hooks, launch_for(ctx.settings))
    if stage is Stage.TRAIN:  # the code that trained it, for the drafter's lineage
        info["environment"] = environment()
    if stage is Stage.EXPORT:
        _register_artifacts(ctx, job.id, files.layout.out, reporter)
    return info


def _generate_with_helpers(ctx: WorkerContext, job: Job, config, files: JobFiles, hooks: StageHooks,
                           reporter: StageReporter, send_helpers: SendHelpers | None) -> dict:
    """The generate stage spread over DRAFTSMITH_WORKER_GENERATE_WORKERS workers (worker/shards.py): this worker
    leads, claims shards beside its helpers, and reports the job's progress summed over every shard."""
    with ShardClaims(ctx, job.id, files.sync, reporter, send_helpers) as shards:
        hooks = dataclasses.replace(hooks, progress=lambda stage, fraction, detail: None,
                                    should_stop=shards.should_stop, shards=shards)
        info = run_stage(Stage.GENERATE, config, files.layout, hooks, launch_for(ctx.settings))
        shards.throughput_event()
    return {**info, "response_tokens_here": shards.tokens_here}


def _register_artifacts(ctx: WorkerContext, job_id: str, out: Path, reporter: StageReporter) -> None:
    """Upload every exported file as a job artifact; the manifest goes last, so a listed manifest means a
    complete set."""
    for name in Manifest.load(out / MANIFEST.path).names():
        path = out / name
        kind = NAMED_KINDS.get(Path(name).name) or ARTIFACT_KINDS.get(path.suffix, "file")
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        reporter.store_artifact(name, path, kind=kind, content_type=content_type)
