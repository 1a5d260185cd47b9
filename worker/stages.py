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
from pathlib import Path

from sqlalchemy import select

from domain import runs as runner
from domain.jobs import load_stored_spec
from domain.models import Job, PromptFile
from domain.settings import Settings
from schemas.job_spec import JobSpec
from schemas.stages import Stage
from trainer.job_config import run_config_from_spec
from trainer.lineage import environment
from trainer.pipeline import Launch, Layout, StageHooks, run_stage
from worker.context import WorkerContext
from worker.drafters import record_lineage, resolve_drafter
from worker.reporting import StageReporter
from worker.sources import Caller, resolve_prompts, resolve_target
from worker.usage import StageUsage
from worker.sync import WorkSync

# What each trainer stage reads, relative to the job's work directory.
STAGE_INPUTS: dict[Stage, tuple[str, ...]] = {
    Stage.PREPARE: (),
    Stage.GENERATE: ("sources.json", "prepare.json", "data"),
    Stage.TRAIN: ("sources.json", "prepare.json", "data", "train"),
    Stage.VALIDATE: ("sources.json", "prepare.json", "train/drafter"),
    Stage.EXPORT: ("sources.json", "prepare.json", "train/drafter", "train/metrics.jsonl", "report.json"),
}
ARTIFACT_KINDS = {".safetensors": "safetensors", ".gguf": "gguf", ".jsonl": "metrics", ".html": "report-html"}
NAMED_KINDS = {"README.md": "model-card", "report.json": "report", "manifest.json": "manifest", "config.json": "config"}


def launch_for(settings: Settings) -> Launch:
    """How this worker runs a stage: what writes regenerated responses (DRAFTSMITH_WORKER_GENERATE_BACKEND), the
    device it has (DRAFTSMITH_WORKER_DEVICE, which a job's compute.device must agree with), and training's
    DRAFTSMITH_WORKER_NPROC processes per node, across the nodes of DRAFTSMITH_WORKER_HOSTFILE when one is set. The
    deployment manifests render both (infra/k8s); tests/infra/test_multinode_launch.py checks the command they lead
    to."""
    return Launch(nproc=settings.worker_nproc, hostfile=settings.worker_hostfile,
                  generate_backend=settings.worker_generate_backend, device=settings.worker_device)


class JobFiles:
    """A job's local directories on this worker and their mirror in object storage."""

    def __init__(self, ctx: WorkerContext, job_id: str):
        root = ctx.job_dir(job_id)
        self.layout = Layout.under(root / "work", root / "artifacts")
        self.sync = WorkSync(ctx.storage, f"jobs/{job_id}/work", root / "work")

    @property
    def work(self) -> Path:
        return self.layout.prepared.parent


def execute_stage(ctx: WorkerContext, job: Job, stage: Stage, reporter: StageReporter) -> dict:
    """Run `stage` of `job` here; return its summary. Raises what the stage raises (DraftsmithError with a code,
    StageInterrupted on cancellation, infrastructure errors for the caller to retry). The attempt's compute
    seconds and tokens count towards the organisation's usage (worker/usage.py), however it ends."""
    with StageUsage(ctx, job, stage) as usage:
        info = _execute_stage(ctx, job, stage, reporter)
        usage.tokens_from(info)
        return info


def _execute_stage(ctx: WorkerContext, job: Job, stage: Stage, reporter: StageReporter) -> dict:
    files = JobFiles(ctx, job.id)
    marker = f"stages/{stage}.json"
    if files.sync.has(marker):
        files.sync.pull(marker)
        reporter.event(f"{stage}: its output is already complete in storage; not running it again")
        return {**json.loads((files.work / marker).read_text()), "reused": True}
    spec = load_stored_spec(job.spec)
    if stage is Stage.PUBLISH:
        from worker.publish import publish_job

        info = publish_job(ctx, job, spec, reporter)
        # The drafter, with its lineage, becomes one of the organisation's published drafters (GET /v1/drafters).
        info["drafter_id"] = record_lineage(ctx, job, spec, reporter.session)
    else:
        files.sync.pull(*STAGE_INPUTS[stage])
        latest = files.layout.train / "checkpoints" / "latest"
        if stage is Stage.TRAIN and latest.is_file():
            checkpoint = latest.read_text().strip()
            reporter.event(f"resuming training from checkpoint {checkpoint}", data={"checkpoint": checkpoint})
            # The series must hold every step once: steps the lost attempt trained up to its checkpoint but had
            # not yet written to the database come back from the checkpoint's metrics.jsonl.
            reporter.restore_metrics(files.layout.train / "metrics.jsonl", int(checkpoint.removeprefix("step-")))
        config = job_run_config(ctx, job, spec, files, reporter, pin=stage is Stage.PREPARE)
        hooks = StageHooks(progress=reporter.progress, should_stop=reporter.should_stop, on_saved=files.sync.push,
                           on_metrics=reporter.metrics)
        if stage is Stage.GENERATE and ctx.settings.worker_generate_workers > 1:
            info = _generate_with_helpers(ctx, job, config, files, hooks, reporter)
        else:
            info = run_stage(stage, config, files.layout, hooks, launch_for(ctx.settings))
        if stage is Stage.TRAIN:  # the code that trained it, for the drafter's lineage
            info["environment"] = environment()
        if stage is Stage.EXPORT:
            _register_artifacts(ctx, job.id, files.layout.out, reporter)
    ctx.storage.put_bytes(f"jobs/{job.id}/work/{marker}", json.dumps(info, default=str).encode())
    return info


def _generate_with_helpers(ctx: WorkerContext, job: Job, config, files: JobFiles, hooks: StageHooks,
                           reporter: StageReporter) -> dict:
    """The generate stage spread over DRAFTSMITH_WORKER_GENERATE_WORKERS workers (worker/shards.py): this worker
    leads, claims shards beside its helpers, and reports the job's progress summed over every shard."""
    from worker.shards import ShardClaims

    with ShardClaims(ctx, job.id, files.sync, reporter) as shards:
        hooks = dataclasses.replace(hooks, progress=lambda stage, fraction, detail: None,
                                    should_stop=shards.should_stop, shards=shards)
        info = run_stage(Stage.GENERATE, config, files.layout, hooks, launch_for(ctx.settings))
        shards.throughput_event()
    return {**info, "response_tokens_here": shards.tokens_here}


def job_run_config(ctx: WorkerContext, job: Job, spec: JobSpec, files: JobFiles, reporter: StageReporter | None, *,
                   pin: bool):
    """The job's RunConfig on this worker: its spec with the target, prompts and parent drafter fetched here."""
    return run_config_from_spec(spec, **local_sources(ctx, job, spec, files, reporter, pin=pin))


def local_sources(ctx: WorkerContext, job: Job, spec: JobSpec, files: JobFiles, reporter: StageReporter | None, *,
                  pin: bool) -> dict[str, str | None]:
    """The target, the prompts (and a warm start's parent drafter) as local paths. `prepare` resolves the URIs and
    records the exact revisions in sources.json (and reports them through `reporter`); later stages, and a generate
    stage's helpers, fetch those revisions, whichever machine they run on."""
    sources_file = files.work / "sources.json"
    if pin or not sources_file.is_file():
        target_uri, source = spec.target.uri, spec.data.source
    else:
        pinned = json.loads(sources_file.read_text())
        target_uri, source = pinned["target"]["pinned_uri"], pinned["prompts"]["pinned_uri"]
    cache = ctx.cache
    caller = Caller(job.org_id, ctx.session_factory)  # every fetch is judged for this organisation
    target = resolve_target(target_uri, ctx.settings, cache, caller=caller, allow_pickle=spec.target.allow_pickle,
                            trust_remote_code=spec.target.trust_remote_code)
    uploaded_key = None
    if source.startswith("file-"):
        with ctx.session_factory() as session:
            uploaded_key = session.scalar(select(PromptFile.storage_key).where(
                PromptFile.id == source, PromptFile.org_id == job.org_id))
    prompts = resolve_prompts(source, ctx.settings, cache, caller=caller, count=spec.data.count,
                              uploaded_key=uploaded_key, storage=ctx.storage)
    parent = None
    if spec.init is not None:  # a warm start: the parent drafter, pinned like the target
        reference = spec.init.from_drafter if pin or not sources_file.is_file() else \
            json.loads(sources_file.read_text()).get("init", {}).get("pinned_uri", spec.init.from_drafter)
        parent = resolve_drafter(reference, ctx, job.org_id)
    if pin:
        pinned = {"target": {"uri": spec.target.uri, "revision": target.revision,
                             "pinned_uri": _pinned(spec.target.uri, target.revision)},
                  "prompts": {"uri": source, "revision": prompts.revision,
                              "pinned_uri": _pinned(source, prompts.revision)}}
        if spec.init is not None and parent is not None:
            pinned["init"] = {"uri": spec.init.from_drafter, "revision": parent.revision,
                              "pinned_uri": _pinned(spec.init.from_drafter, parent.revision)}
        sources_file.parent.mkdir(parents=True, exist_ok=True)
        sources_file.write_text(json.dumps(pinned, indent=2))
        files.sync.push(sources_file)
        reporter.event(f"target {spec.target.uri}" + (f" pinned at revision {target.revision}" if target.revision else ""),
                       data={"target_revision": target.revision, "prompts_revision": prompts.revision})
    return {"target": target.path, "prompts": prompts.path, "parent_drafter": parent.path if parent else None}


def _pinned(uri: str, revision: str | None) -> str:
    if uri.startswith("hf://") and revision:
        return f"{uri.partition('@')[0]}@{revision}"
    return uri


def _register_artifacts(ctx: WorkerContext, job_id: str, out: Path, reporter: StageReporter) -> None:
    """Upload every exported file as a job artifact; the manifest goes last, so a listed manifest means a
    complete set."""
    manifest = json.loads((out / "manifest.json").read_text())
    for name in [*manifest["files"], "manifest.json"]:
        path = out / name
        kind = NAMED_KINDS.get(Path(name).name) or ARTIFACT_KINDS.get(path.suffix, "file")
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        runner.store_artifact(reporter.session, ctx.storage, job_id, name, path, kind=kind,
                              content_type=content_type, stage=Stage.EXPORT)
