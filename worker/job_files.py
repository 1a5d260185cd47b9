"""A job's files on this worker (JobFiles: its local folders and their mirror in object storage), the RunConfig its
spec becomes here with the target, prompts and parent drafter fetched (job_run_config), and how this worker runs
a stage (launch_for). Shared by a stage's run (worker/stages.py) and a generate stage's helpers (worker/shards.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from domain.files import uploaded_prompts_key
from domain.models import Job
from domain.settings import Settings
from schemas.job_folder import SOURCES
from schemas.job_spec import JobSpec
from schemas.work_files import PinnedSource, PinnedSources
from trainer.job_config import run_config_from_spec
from trainer.pipeline import Launch, Layout
from trainer.targets.adapters import require_base
from worker.context import WorkerContext
from worker.drafters import resolve_drafter
from worker.reporting import JobRecords
from worker.sources import Caller, ShouldStop, resolve_prompts, resolve_target
from worker.sync import job_work


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
        self.sync = job_work(ctx.storage, job_id, root)

    @property
    def work(self) -> Path:
        return self.layout.prepared.parent


def job_run_config(ctx: WorkerContext, job: Job, spec: JobSpec, files: JobFiles, reporter: JobRecords | None, *,
                   pin: bool, should_stop: ShouldStop | None = None):
    """The job's RunConfig on this worker: its spec with the target, prompts and parent drafter fetched here (a
    fetch stops mid-download when `should_stop` says so)."""
    return run_config_from_spec(spec, **local_sources(ctx, job, spec, files, reporter, pin=pin,
                                                      should_stop=should_stop),
                                target_limits=ctx.settings.target_limits)


def local_sources(ctx: WorkerContext, job: Job, spec: JobSpec, files: JobFiles, reporter: JobRecords | None, *,
                  pin: bool, should_stop: ShouldStop | None = None) -> dict[str, str | None]:
    """The target, the prompts (and a warm start's parent drafter) as local paths. `prepare` resolves the URIs and
    records the exact revisions in sources.json (and reports them through `reporter`); later stages, and a generate
    stage's helpers, fetch those revisions, whichever machine they run on."""
    sources_file = files.work / SOURCES.path
    # Not yet pinned (or a pin that cannot be read): the spec's own URIs, as prepare fetched them.
    recorded = PinnedSources() if pin or not sources_file.is_file() else PinnedSources.load(sources_file)
    target_uri = _pinned_or(recorded.target, spec.target.uri)
    source = _pinned_or(recorded.prompts, spec.data.source)
    base_uri = None if spec.target.base is None else _pinned_or(recorded.base, spec.target.base)
    cache = ctx.cache
    caller = Caller(job.org_id, ctx.session_factory)  # every fetch is judged for this organisation
    target = resolve_target(target_uri, ctx.settings, cache, caller=caller, allow_pickle=spec.target.allow_pickle,
                            trust_remote_code=spec.target.trust_remote_code, should_stop=should_stop)
    # An adapter is loaded over the base the job names, never over what its own config names (not even looked up).
    require_base(Path(target.path), spec.target.base)
    # An adapter target's base model: fetched by the same function, so the same scope, credentials and file rules
    base = None if base_uri is None else resolve_target(
        base_uri, ctx.settings, cache, caller=caller, allow_pickle=spec.target.allow_pickle,
        trust_remote_code=spec.target.trust_remote_code, should_stop=should_stop)
    with ctx.session_factory() as session:
        uploaded_key = uploaded_prompts_key(session, job.org_id, source)
    prompts = resolve_prompts(source, ctx.settings, cache, caller=caller, count=spec.data.count,
                              uploaded_key=uploaded_key, storage=ctx.storage, should_stop=should_stop)
    parent = None
    if spec.init is not None:  # a warm start: the parent drafter, pinned like the target
        parent = resolve_drafter(_pinned_or(recorded.init, spec.init.from_drafter), ctx, job.org_id)
    if pin:
        pins = {"target": _pin(spec.target.uri, target.revision), "prompts": _pin(source, prompts.revision)}
        if base is not None and spec.target.base is not None:
            pins["base"] = _pin(spec.target.base, base.revision)
        if spec.init is not None and parent is not None:
            pins["init"] = _pin(spec.init.from_drafter, parent.revision)
        sources_file.parent.mkdir(parents=True, exist_ok=True)
        sources_file.write_text(json.dumps(PinnedSources.written(**pins).to_json(), indent=2))
        files.sync.push(sources_file)
        reporter.event(f"target {spec.target.uri}" + (f" pinned at revision {target.revision}" if target.revision else ""),
                       data={"target_revision": target.revision, "prompts_revision": prompts.revision})
    return {"target": target.path, "prompts": prompts.path, "parent_drafter": parent.path if parent else None,
            "base": base.path if base else None}


def _pin(uri: str, revision: str | None) -> PinnedSource:
    return PinnedSource(uri=uri, revision=revision, pinned_uri=_pinned(uri, revision))


def _pinned_or(recorded: PinnedSource | None, uri: str) -> str:
    """The URI prepare pinned, else `uri` (the spec's)."""
    return recorded.pinned_uri if recorded is not None and recorded.pinned_uri else uri


def _pinned(uri: str, revision: str | None) -> str:
    if uri.startswith("hf://") and revision:
        return f"{uri.partition('@')[0]}@{revision}"
    return uri
