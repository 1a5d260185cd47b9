"""The stages of one job, and the one place they are wired: `run_stage(stage, config, layout, hooks)`.

`draftsmith run` (`Run`, at the end), the per-stage CLI commands, the bench and the Celery worker all call
these functions; none of them re-wires prompts, taps, drafter shapes or data paths on its own.

    work/prepare.json   what `prepare` decided (target fingerprint, mask token, taps, prompt counts)
    work/data/          regenerated training set (resumable by shard)
    work/train/         checkpoints/, metrics.jsonl, drafter/ (reference format)
    work/report.json    validation report
    out/                the artifacts (trainer/export/artifacts.py), manifest.json written last

Stages read their inputs from the layout and write their outputs there; a stage run again resumes
(generation by shard, training from its last checkpoint). `StageHooks` is how a caller watches and steers
a stage: progress as a fraction of the stage, a `should_stop` poll (cancellation), `on_saved(path)` after
every durable write (the worker copies those to object storage), and numeric training metrics.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import job_folder, recipe
from schemas.bounds import TargetLimits
from schemas.sampling import SamplingParams
from schemas.stages import GENERATE_BACKENDS, LOCAL_STAGES, Stage
from schemas.validation_report import (
    DrafterAdapterFigures,
    EngineFigures,
    TargetDescription,
    TrainingObjective,
    ValidationReport,
    WarmStartParent,
)
from schemas.work_files import PreparedParent, PreparedTarget
from trainer.atomic import atomic_write_json
from trainer.errors import DraftsmithError, StageInterrupted
from trainer.training.config import TrainConfig
from trainer.validation import SAMPLING_DRAWS, VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS

if TYPE_CHECKING:  # torch is imported by the stages that use it, not by this module's importers
    from trainer.data.regenerate import ResponseBackend, ShardPlan
    from trainer.device import DevicePlan


def __getattr__(name: str):
    """`LAUNCHER_VARIABLES` (public: callers that start ranks), read on first use: trainer/training/distributed.py,
    which defines it, imports torch, and importing this module must not (tests/test_layout.py)."""
    if name == "LAUNCHER_VARIABLES":
        from trainer.training.distributed import LAUNCHER_VARIABLES

        return LAUNCHER_VARIABLES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Progress = Callable[[str, float, str], None]
"""(stage, fraction of the stage done in [0, 1], detail). The one progress unit of the trainer."""


@dataclass(frozen=True)
class RunConfig:
    """Every knob of one job's ML work. Defaults are the default recipe (schemas/recipe.py); a REST job gets
    its RunConfig from its JobSpec through trainer/job_config.py, `draftsmith run` from its flags the same way."""

    target: str
    """Target directory, or a bundled name (smollm2-135m), or a LoRA adapter folder (trainer/targets/adapters.py)."""
    base: str | None = None
    """For an adapter target: the base model's folder (None: the local folder the adapter names, if any)."""
    # The two names below only label the report and the card: two jobs that train the same drafter compare
    # equal whichever way they spelled the target (compare=False).
    target_name: str | None = field(default=None, compare=False)
    """How the job names its target in report.json and the model card (a REST job: its target.uri, never the
    worker's local copy; None: `target` as given)."""
    base_name: str | None = field(default=None, compare=False)
    """How the job names an adapter target's base there (a REST job: its target.base; None: `base`)."""
    parent_name: str | None = field(default=None, compare=False)
    """How the job names a warm start's parent there (its init.from_drafter; None: the local folder)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompts: str = "builtin"
    """`builtin` or a local .jsonl/.parquet prompts file."""
    num_prompts: int | None = None
    """Prompts drawn from the source, hold-out included (None: all of them)."""
    holdout: float = recipe.HOLDOUT_SHARE
    variant: str = recipe.VARIANT
    num_layers: int = recipe.NUM_LAYERS
    block_size: int = recipe.BLOCK_SIZE
    target_layer_ids: tuple[int, ...] | None = None
    """Target layers tapped (None: the reference rule for the target's depth)."""
    mask_token_id: int | None = None
    allow_pickle: bool = False
    """Accept pickle weights for the target (a job must say so explicitly)."""
    device: str = "auto"
    """What the job needs (schemas/compute.py): auto, cpu, cuda or cuda:N; combined with `Launch.device`."""
    dtype: str = "auto"
    """auto (bfloat16 on a GPU, float32 on the CPU) or float32."""
    trust_remote_code: bool = False
    """Let the target's tokenizer/config run code shipped with the checkpoint (a job must say so explicitly, and
    the deployment allow it). The model itself must still be one of the supported architectures."""
    target_limits: TargetLimits = field(default_factory=TargetLimits, compare=False)
    """The largest target this machine loads (the worker's DRAFTSMITH_TARGET_* settings), judged from the target's
    config and weight headers before anything is allocated (trainer/targets/preflight.py)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    generation_batch_size: int = 32
    generation_shard_size: int = recipe.GENERATION_SHARD_SIZE
    """Prompts per regeneration shard (schemas/recipe.py): part of the data's identity."""
    cache_budget_mb: int = 4096
    validation_prompts: int = VALIDATION_PROMPTS
    validation_max_new_tokens: int = VALIDATION_MAX_NEW_TOKENS
    sampling_draws: int = SAMPLING_DRAWS
    engines: tuple[str, ...] | None = None
    """Serving engines validation also measures the drafter in (trainer/validation/engines.py: `llama.cpp`,
    `vllm`); None: every one installed on this machine, () none. An engine that is not installed is skipped."""

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda o: o.model_dump(mode="json")))

    @classmethod
    def from_json(cls, data: dict) -> RunConfig:
        data = dict(data)
        taps, engines = data.get("target_layer_ids"), data.get("engines")
        if "target_limits" in data:
            data["target_limits"] = TargetLimits.model_validate(data["target_limits"])
        return cls(**{**data, "sampling": SamplingParams.model_validate(data["sampling"]),
                      "train": TrainConfig(**data["train"]),
                      "target_layer_ids": tuple(taps) if taps is not None else None,
                      "engines": tuple(engines) if engines is not None else None})


@dataclass(frozen=True)
class Layout:
    """Where a job's files live on this machine. `Layout.under(work, out)` is the standard tree above; the
    per-stage CLI commands point single paths elsewhere."""

    prepared: Path
    data: Path
    train: Path
    drafter: Path
    report: Path
    metrics: Path
    out: Path

    @classmethod
    def under(cls, work: str | Path, out: str | Path) -> Layout:
        # Every path from the table of a job's files (schemas/job_folder.py), none spelled here again.
        work = Path(work)
        return cls(prepared=work / job_folder.PREPARED.path, data=(work / job_folder.DATA_META.path).parent,
                   train=(work / job_folder.STEP_RECORDS.path).parent,
                   drafter=(work / job_folder.DRAFTER_CONFIG.path).parent, report=work / job_folder.REPORT.path,
                   metrics=work / job_folder.STEP_RECORDS.path, out=Path(out))


@dataclass
class StageHooks:
    progress: Progress = lambda stage, fraction, detail: None
    should_stop: Callable[[], bool] = lambda: False
    on_saved: Callable[[Path], None] = lambda path: None
    on_metrics: Callable[[int, dict[str, float]], None] = lambda step, values: None
    """Training metrics per step, numbers only (per-position accuracy flattened to accuracy_pos_<k>)."""
    shards: ShardPlan | None = None
    """Generation's shards when several workers share one job's (worker/shards.py); None: this process writes all."""


@dataclass(frozen=True)
class Launch:
    """How training runs: in this process (nproc 1), or under torchrun / the DeepSpeed launcher."""

    nproc: int = 1
    """Processes per node: devices on a GPU machine, gloo processes on a CPU one."""
    hostfile: str | None = None
    """A DeepSpeed hostfile for training across several nodes."""
    device: str = "auto"
    """What this machine has (DRAFTSMITH_WORKER_DEVICE, schemas/compute.py): the job's `RunConfig.device` must
    agree with it."""
    generate_backend: str = "builtin"
    """What writes the regenerated responses: `builtin` (the target's own batched loop, capturing the hidden states
    as it goes) or `vllm` (vLLM answers, then one teacher-forced pass of the target captures them)."""


def step_metrics(record: dict) -> dict[str, float]:
    """A training step's record as plain numbers: lists are flattened, missing values dropped."""
    values: dict[str, float] = {}
    for name, value in record.items():
        if name == "step" or value is None or isinstance(value, bool):
            continue
        if isinstance(value, list):
            values.update({f"{name.removesuffix('_per_position')}_pos_{k}": float(v)
                           for k, v in enumerate(value, start=1) if v is not None})
        elif isinstance(value, (int, float)):
            values[name] = float(value)
    return values


def job_device_plan(config: RunConfig, machine_device: str = "auto") -> DevicePlan:
    """Where the job's target runs on this machine: the job's device and dtype against the machine's setting
    (trainer/device.py, the one decision)."""
    from trainer.device import resolve_device

    return resolve_device(config.device, config.dtype, worker=machine_device)


def load_job_target(config: RunConfig, plan: DevicePlan | None = None):
    """The job's target as this machine has it (prepare.json records where another machine had it), on `plan`'s
    device and dtype (None: the job's own plan against a machine set to auto)."""
    from trainer.targets import load_target
    from trainer.targets.bundled import resolve_target_path

    plan = plan or job_device_plan(config)
    base = resolve_target_path(config.base) if config.base else None
    return load_target(resolve_target_path(config.target), device=plan.device, dtype=plan.dtype,
                       allow_pickle=config.allow_pickle, trust_remote_code=config.trust_remote_code,
                       limits=config.target_limits,
                       may_split=plan.count > 1, base=base)  # a job that names one GPU (cuda:N) is never split


def parent_drafter(config: RunConfig, num_target_layers: int | None = None):
    """The drafter a warm start begins from (`config.train.init = "drafter:DIR"`), recognised in whichever
    format wrote it (trainer/drafter/formats.py `ParentCheckpoint`: its shape and origin), else None.
    `num_target_layers`: the target's depth, for a format that does not record it."""
    if not config.train.parent_drafter:
        return None
    from trainer.drafter.formats import read_parent

    return read_parent(config.train.parent_drafter, num_target_layers=num_target_layers)


def parent_drafter_config(config: RunConfig, num_target_layers: int | None = None):
    """The shape of the drafter a warm start begins from, in any format, else None."""
    parent = parent_drafter(config, num_target_layers)
    return None if parent is None else parent.config


def read_prepared(prepared: PreparedTarget | Mapping[str, Any], where: object = "prepare.json") -> PreparedTarget:
    """prepare.json's content, read leniently (schemas/work_files.py), with the two decisions the later stages
    cannot do without: a file that lacks them is prepare's to write again, not a guess of ours."""
    read = PreparedTarget.read(prepared)
    missing = [name for name in ("mask_token_id", "tap_layer_ids") if getattr(read, name) is None]
    if missing:
        raise DraftsmithError(f"{where} has no usable {' or '.join(missing)}: run the prepare stage again")
    return read


def drafter_config_for(config: RunConfig, target, prepared: PreparedTarget | Mapping[str, Any]):
    """The drafter's shape: the job's variant, depth and block size on the target, with prepare's mask token
    and taps. The one place a DrafterConfig is built from a job."""
    from trainer.drafter.config import DrafterConfig

    decided = read_prepared(prepared)
    return DrafterConfig.for_target(target, variant=config.variant, num_layers=config.num_layers,
                                    block_size=config.block_size, mask_token_id=decided.mask_token_id,
                                    target_layer_ids=decided.tap_layer_ids)


@contextmanager
def response_backend(name: str, target) -> Iterator[ResponseBackend | None]:
    """The engine that writes regenerated responses, open for the stage (None: the built-in loop)."""
    if name == "builtin":
        yield None
        return
    if name not in GENERATE_BACKENDS:
        raise DraftsmithError(f"generate backend {name!r} is not one of {', '.join(GENERATE_BACKENDS)}")
    from trainer.data.vllm_backend import VllmResponses

    with VllmResponses(target) as backend:
        yield backend


# --- the stages --------------------------------------------------------------------------------------


def parent_description(prepared: PreparedParent | None, name: str) -> WarmStartParent:
    """report.json's `warm_start.parent`: the parent as the job named it, with its format and what the warm start
    changed as prepare recorded them (an older prepare.json records none of these)."""
    origin = getattr(prepared, "origin", None)  # a model, or a plain object where prepare.json is newer than this code
    recorded: dict = origin if isinstance(origin, dict) else origin.to_json() if origin is not None else {}
    fields = {key: recorded[key] for key in WarmStartParent.model_fields if key in recorded and key != "name"}
    return WarmStartParent.read({"name": name, **fields})


def adapter_description(drafter_dir: Path) -> DrafterAdapterFigures | None:
    """report.json's `warm_start.adapter`: the size of the drafter adapter trained beside `drafter_dir`, if any."""
    from trainer.training.drafter_adapter import adapter_figures, adapter_folder

    folder = adapter_folder(drafter_dir)
    return None if folder is None else DrafterAdapterFigures.model_validate(adapter_figures(folder, drafter_dir))


class JobStages:
    """One job's config, layout and hooks, with the target loaded once for every stage run here."""

    def __init__(self, config: RunConfig, layout: Layout, hooks: StageHooks, launch: Launch):
        self.config, self.layout, self.hooks, self.launch = config, layout, hooks, launch
        self._target, self._plan = None, None
        self.stage: str | None = None
        """The stage running now (run_stage sets it), for the event that names the device."""

    @property
    def plan(self) -> DevicePlan:
        if self._plan is None:
            self._plan = job_device_plan(self.config, self.launch.device)
        return self._plan

    @property
    def target(self):
        if self._target is None:
            # An event, so the dashboard and the CLI show where the stage runs before its first real progress.
            self.hooks.progress(self.stage or Stage.PREPARE, 0.0, f"loading the target on {self.plan.summary()}")
            from trainer.interruptible import stops_on_request

            # transformers' loader never polls: a cancel must still end a load of a large target within seconds.
            with stops_on_request(self.hooks.should_stop):
                self._target = load_job_target(self.config, self.plan)
        return self._target

    def prompts(self):
        from trainer.data.prompts import draw_prompts, split_prompts

        prompts = draw_prompts(self.config.prompts, self.config.num_prompts, self.config.sampling.seed)
        return split_prompts(prompts, self.config.holdout, self.config.sampling.seed)

    def prepared(self) -> PreparedTarget:
        if not self.layout.prepared.is_file():
            raise DraftsmithError(f"{self.layout.prepared} is missing: run the prepare stage first")
        return read_prepared(PreparedTarget.load(self.layout.prepared), self.layout.prepared)

    def prepare(self) -> dict:
        from trainer.drafter.config import default_target_layer_ids
        from trainer.targets.chat import choose_mask_token_id
        from trainer.targets.self_test import require_passed, run_self_test

        target, c = self.target, self.config
        train_prompts, holdout = self.prompts()  # validates the prompts file before any compute
        # The target's own speculative decoding against its plain decoding, before anything is spent on it: an
        # architecture whose cache does not roll back exactly is refused here naming the layer (listed or not).
        self_test = run_self_test(target, seed=c.sampling.seed or 0)
        self.hooks.progress(Stage.PREPARE, 0.5, f"self-test {'passed' if self_test.passed else 'FAILED'} in "
                            f"{self_test.seconds} s ({self_test.tokens} tokens, {self_test.cycles} verifies)")
        require_passed(self_test, target.family["model_type"])
        mask_token_id, reason = ((c.mask_token_id, "given") if c.mask_token_id is not None
                                 else choose_mask_token_id(target.tokenizer, target.vocab_size))
        taps = list(c.target_layer_ids) if c.target_layer_ids else default_target_layer_ids(target.num_layers,
                                                                                            c.num_layers)
        recognised = parent_drafter(c, target.num_layers)
        parent = None if recognised is None else recognised.config
        if parent is not None:  # a warm start keeps the parent's mask token and taps unless the job names its own
            from trainer.training.init import IncompatibleDrafter, parent_target_mismatches

            misfit = parent_target_mismatches(parent, hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                                              num_layers=target.num_layers)
            if misfit:  # before the taps and mask token below are taken from it
                raise IncompatibleDrafter(f"cannot warm-start from the drafter {c.train.parent_drafter}: "
                                          + "; ".join(misfit))
            if c.mask_token_id is None:
                mask_token_id, reason = parent.mask_token_id, "the parent drafter's (warm start)"
            taps = list(c.target_layer_ids or parent.target_layer_ids)
        prepared = PreparedTarget.written(
            target_path=str(target.path), fingerprint=target.fingerprint,
            adapter_path=None if target.adapter_path is None else str(target.adapter_path),
            mask_token_id=mask_token_id, mask_token_rule=reason, tap_layer_ids=taps,
            train_prompts=len(train_prompts), holdout_prompts=len(holdout), self_test=self_test)
        shape = drafter_config_for(c, target, prepared)  # validates the drafter's shape (taps in range, mask id) now
        if recognised is not None:
            from trainer.drafter.upgrade import upgrades
            from trainer.training.init import check_warm_start

            check_warm_start(recognised.config, shape, c.train.parent_drafter)  # refused here, before any compute
            origin = recognised.origin.model_copy(update={"upgrades": upgrades(recognised.config, shape)})
            prepared.parent_drafter = PreparedParent(path=c.train.parent_drafter, origin=origin,
                                                     target_fingerprint=recognised.config.target_fingerprint)
        atomic_write_json(self.layout.prepared, prepared.to_json())
        self.hooks.on_saved(self.layout.prepared)
        summary = {k: v for k, v in prepared.to_json().items() if k != "version"}
        return {**summary, "device": self.plan.describe()}

    def generate(self) -> dict:
        from trainer.data.regenerate import regenerate

        train_prompts, _ = self.prompts()

        def on_progress(done: int, total: int, tokens: int, fraction: float) -> None:
            # Tokens against the planned ones: it moves inside a batch, not once per batch (regenerate).
            self.hooks.progress(Stage.GENERATE, fraction, f"{done}/{total} prompts, {tokens} tokens")

        with response_backend(self.launch.generate_backend, self.target) as backend:
            store = regenerate(self.target, train_prompts, self.config.sampling, self.layout.data,
                               tap_layer_ids=self.prepared().tap_layer_ids,
                               cache_budget_bytes=self.config.cache_budget_mb << 20,
                               shard_size=self.config.generation_shard_size,
                               batch_size=self.config.generation_batch_size, on_progress=on_progress,
                               should_stop=self.hooks.should_stop, on_saved=self.hooks.on_saved,
                               shards=self.hooks.shards, backend=backend)
        engine = {"backend": self.launch.generate_backend}
        if backend is not None:  # what the engine itself spent, apart from the target's capture pass
            engine.update(backend_seconds=round(backend.seconds, 3), backend_tokens=backend.tokens)
        engine["device"] = self.plan.describe()
        if store is None:  # a helper's share is written; the worker that runs the stage finishes the data set
            return {"helper": True, **engine}
        return {"plan": store.meta.plan, **engine, **store.summary()}

    def on_train_step(self, record: dict) -> None:
        # The schedule's own progress (steps or time budget, whichever ends the run first: training/schedule.py).
        fraction = max(record["step"] / self.config.train.steps, record.get("progress", 0.0))
        self.hooks.progress(Stage.TRAIN, min(fraction, 1.0), f"step {record['step']} loss {record['loss']:.3f} "
                            f"tau~{record['train_tau_estimate']:.2f} {record['tokens_per_s']:.0f} tok/s")
        self.hooks.on_metrics(record["step"], step_metrics(record))

    def train(self) -> dict:
        from trainer.training.launch import train_drafter

        resume = (self.layout.train / "checkpoints" / "latest").is_file()
        in_process = self.launch.nproc <= 1 and not self.launch.hostfile
        train_drafter(self.config, self.prepared(), self.layout.data, self.layout.train, self.launch, resume=resume,
                      on_step=self.on_train_step, should_stop=self.hooks.should_stop, on_saved=self.hooks.on_saved,
                      target=self.target if in_process else None, plan=self.plan)
        records = self.layout.metrics.read_text().splitlines()
        last = json.loads(records[-1])
        budget = last.get("budget_s")
        return {"steps": last["step"], "planned_steps": self.config.train.steps,
                "budget_minutes": None if budget is None else round(budget / 60, 2),
                "seconds_per_step": round(last["elapsed_s"] / last["step"], 3),  # elapsed_s counts earlier attempts
                "final_loss": last["loss"], "train_tau_estimate": last["train_tau_estimate"],
                "device": self.plan.describe()}

    def target_description(self) -> TargetDescription:
        """The target as the job named it (never a worker's local copy) and its family, for report.json and the
        model card."""
        c = self.config
        described = self.target.describe(c.target_name or c.target, c.base_name or c.base)
        if self.layout.prepared.is_file():  # the self-test prepare ran on this checkpoint
            described.self_test = PreparedTarget.load(self.layout.prepared).self_test
        return described

    def validate(self) -> dict:
        from trainer.drafter.checkpoint import load_drafter
        from trainer.training.position_weights import describe_objective
        from trainer.validation.report import require_passed, validate

        _, holdout = self.prompts()
        drafter = load_drafter(self.layout.drafter, self.target.device, self.target.dtype)

        def on_progress(done: int, total: int, detail: str) -> None:
            if self.hooks.should_stop():  # nothing to keep: validation starts over when the stage resumes
                raise StageInterrupted(f"validation stopped on request ({detail})")
            self.hooks.progress(Stage.VALIDATE, 0.95 * done / total, detail)

        parent = None
        if self.config.train.parent_drafter:  # a warm start: was it worth it, on this very target, prompts and mode?
            from trainer.audit import load_parent

            parent = load_parent(self.target, self.config.train.parent_drafter)
        report = validate(self.target, drafter, holdout[:self.config.validation_prompts], self.config.sampling,
                          max_new_tokens=self.config.validation_max_new_tokens,
                          sampling_draws=self.config.sampling_draws, on_progress=on_progress, device_plan=self.plan,
                          parent=parent)
        if report.warm_start is not None:
            report.warm_start.parent = parent_description(self.prepared().parent_drafter, self.config.parent_name
                                                          or self.config.train.parent_drafter or "")
            report.warm_start.adapter = adapter_description(self.layout.drafter)
        if report.passed and self.config.engines != ():  # engine figures only for a drafter that will ship
            from trainer.validation.engines import engine_step

            self.hooks.progress(Stage.VALIDATE, 0.97, "measuring the drafter in the serving engines")
            report.engines = EngineFigures.model_validate(engine_step(
                self.target, self.layout.drafter, holdout[:self.config.validation_prompts], self.config.sampling,
                work_dir=self.layout.report.parent / "engines", engines=self.config.engines,
                num_speculative_tokens=report.recommended_block_size - 1, should_stop=self.hooks.should_stop))
        report.target = self.target_description()
        report.training_objective = TrainingObjective.model_validate(
            describe_objective(self.config.train, self.config.block_size))
        atomic_write_json(self.layout.report, report.to_json())
        self.hooks.on_saved(self.layout.report)
        require_passed(report)  # a drafter that changes the output is never exported
        summary = {"tau": report.tau, "speedup": report.speedup.ratio, "device": report.device.to_json()}
        if report.warm_start is not None:
            summary.update(parent_tau=report.warm_start.parent_tau, advice=report.warm_start.advice)
        return summary

    def export(self) -> dict:
        from trainer.export.artifacts import export_artifacts

        report = ValidationReport.load(self.layout.report) if self.layout.report.is_file() else None
        manifest = export_artifacts(self.layout.drafter, self.target, self.layout.out, report=report,
                                    metrics_file=self.layout.metrics, names=self.target_description())
        self.hooks.on_saved(self.layout.out)
        return {"files": len(manifest.files), "device": self.plan.describe()}


STAGES: dict[Stage, Callable[[JobStages], dict | None]] = {
    Stage.PREPARE: JobStages.prepare,
    Stage.GENERATE: JobStages.generate,
    Stage.TRAIN: JobStages.train,
    Stage.VALIDATE: JobStages.validate,
    Stage.EXPORT: JobStages.export,
}
"""Which `JobStages` method runs each of the trainer's stages (publish is the worker's alone)."""

TRAINER_STAGES = LOCAL_STAGES
assert tuple(STAGES) == TRAINER_STAGES, "every stage draftsmith runs needs its entry in STAGES, in order"


def run_stage(stage: Stage | str, config: RunConfig, layout: Layout, hooks: StageHooks | None = None,
              launch: Launch = Launch(), *, job: JobStages | None = None) -> dict:
    """Run one stage of the trainer's part of a job; return a summary of what it did (JSON-able).

    Raises DraftsmithError (with a `code`) on bad input, StageInterrupted when `hooks.should_stop` said so.
    Pass `job` (from `open_job`) to run several stages with the target loaded once."""
    stage = Stage(stage)
    if stage not in TRAINER_STAGES:
        raise DraftsmithError(f"stage {stage} is not the trainer's: it runs {', '.join(TRAINER_STAGES)}")
    job = job or open_job(config, layout, hooks, launch)
    layout.prepared.parent.mkdir(parents=True, exist_ok=True)
    job.stage = stage
    return STAGES[stage](job) or {}


def open_job(config: RunConfig, layout: Layout, hooks: StageHooks | None = None, launch: Launch = Launch()) -> JobStages:
    return JobStages(config, layout, hooks or StageHooks(), launch)


class Run:
    """`draftsmith run`: the trainer's stages in order in one process. OUT/.work/state.json records the
    settings and each finished stage; `--resume` skips finished stages (the long ones resume inside) and
    refuses different settings. A failed validation keeps its report in .work/ and exports nothing."""

    def __init__(self, config: RunConfig, out_dir: str | Path, progress: Progress | None = None,
                 launch: Launch = Launch()):
        self.config, self.launch = config, launch
        self.work = Path(out_dir) / ".work"
        self.layout = Layout.under(self.work, out_dir)
        self.hooks = StageHooks(progress=progress) if progress else StageHooks()
        self.state: dict = {}

    def execute(self, resume: bool = False) -> dict:
        import time

        self._open_state(resume)
        job = open_job(self.config, self.layout, self.hooks, self.launch)
        for stage in TRAINER_STAGES:
            if self.state["stages"].get(stage, {}).get("done"):
                self.hooks.progress(stage, 1.0, "done earlier")
                continue
            started = time.perf_counter()
            self.hooks.progress(stage, 0.0, "starting")
            info = run_stage(stage, self.config, self.layout, self.hooks, self.launch, job=job)
            self.state["stages"][stage] = {"done": True, "seconds": round(time.perf_counter() - started, 1), **info}
            atomic_write_json(self.work / "state.json", self.state)
            self.hooks.progress(stage, 1.0, "done")
        return self.state

    def _open_state(self, resume: bool) -> None:
        state_file = self.work / "state.json"
        settings = self.config.to_json()
        if state_file.is_file():
            if not resume:
                raise DraftsmithError(f"{self.layout.out} already holds a run; pass --resume to continue it or "
                                      "choose another --out")
            self.state = json.loads(state_file.read_text())
            # Read back through RunConfig, so a setting added since the run began compares as its default and an
            # older run still resumes.
            recorded = RunConfig.from_json(self.state["config"]).to_json()
            changed = sorted(k for k in settings if settings[k] != recorded.get(k))
            if changed:
                raise DraftsmithError(f"--resume with different settings ({', '.join(changed)}); use the same "
                                      "flags as the interrupted run, or a new --out")
        else:
            self.work.mkdir(parents=True, exist_ok=True)
            self.state = {"config": settings, "stages": {}}
            atomic_write_json(state_file, self.state)
