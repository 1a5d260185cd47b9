"""`draftsmith run`: prepare -> generate -> train -> validate -> export, in one process, resumable.

    OUT/                the artifacts (trainer/export/artifacts.py), written last
    OUT/.work/          state.json (finished stages and the run's settings), data/, train/, report.json

Each stage records itself in state.json when done; `--resume` skips finished stages, and the two long
ones resume inside (generation by shard, training from its last checkpoint). A failed validation keeps
its report in .work/ and never produces artifacts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from schemas.sampling import SamplingParams
from trainer.data.prompts import load_prompts, split_prompts
from trainer.data.regenerate import regenerate
from trainer.data.store import DataStore
from trainer.atomic import atomic_write_json
from trainer.drafter.checkpoint import load_drafter
from trainer.drafter.config import DrafterConfig, default_target_layer_ids
from trainer.errors import DraftsmithError
from trainer.export.artifacts import export_artifacts
from trainer.targets import load_target
from trainer.targets.bundled import resolve_target_path
from trainer.targets.chat import choose_mask_token_id
from trainer.training.config import MAIN_JOB_TRAINING, TrainConfig
from trainer.training.loop import Trainer
from trainer.validation import SAMPLING_DRAWS, VALIDATION_MAX_NEW_TOKENS, VALIDATION_PROMPTS
from trainer.validation.report import require_passed, validate

STAGES = ("prepare", "generate", "train", "validate", "export")


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a local run. Defaults finish well under 30 minutes for SmolLM2-135M on 2 CPU cores."""

    target: str
    """Target directory, or a bundled name (smollm2-135m)."""
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=128))
    prompts: str = "builtin"
    num_prompts: int | None = None
    """Training prompts regenerated (None: all of the set's training split)."""
    holdout: float = 0.1
    variant: str = "dflash2"
    num_layers: int = 2
    block_size: int = 8
    mask_token_id: int | None = None
    train: TrainConfig = MAIN_JOB_TRAINING
    generation_batch_size: int = 32
    cache_budget_mb: int = 4096
    validation_prompts: int = VALIDATION_PROMPTS
    validation_max_new_tokens: int = VALIDATION_MAX_NEW_TOKENS
    sampling_draws: int = SAMPLING_DRAWS

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda o: o.model_dump(mode="json")))


Progress = Callable[[str, float, str], None]
"""(stage, fraction of the stage done, detail)."""


class Run:
    def __init__(self, config: RunConfig, out_dir: str | Path, progress: Progress | None = None):
        self.config, self.out = config, Path(out_dir)
        self.work = self.out / ".work"
        self.progress = progress or (lambda stage, fraction, detail: None)
        self.state: dict = {}
        self.target = None

    def execute(self, resume: bool = False) -> dict:
        self._open_state(resume)
        for stage in STAGES:
            if self.state["stages"].get(stage, {}).get("done"):
                self.progress(stage, 1.0, "done earlier")
                continue
            started = time.perf_counter()
            self.progress(stage, 0.0, "starting")
            info = getattr(self, f"_{stage}")() or {}
            self.state["stages"][stage] = {"done": True, "seconds": round(time.perf_counter() - started, 1), **info}
            self._save_state()
            self.progress(stage, 1.0, "done")
        return self.state

    # --- state ---------------------------------------------------------------------------------

    def _open_state(self, resume: bool) -> None:
        state_file = self.work / "state.json"
        settings = self.config.to_json()
        if state_file.is_file():
            if not resume:
                raise DraftsmithError(f"{self.out} already holds a run; pass --resume to continue it or choose "
                                      "another --out")
            self.state = json.loads(state_file.read_text())
            if self.state["config"] != settings:
                changed = sorted(k for k in settings if settings[k] != self.state["config"].get(k))
                raise DraftsmithError(f"--resume with different settings ({', '.join(changed)}); use the same "
                                      "flags as the interrupted run, or a new --out")
        else:
            self.work.mkdir(parents=True, exist_ok=True)
            self.state = {"config": settings, "stages": {}}
            self._save_state()

    def _save_state(self) -> None:
        atomic_write_json(self.work / "state.json", self.state)

    def _load_target(self):
        if self.target is None:
            self.target = load_target(resolve_target_path(self.config.target))
        return self.target

    def _prompts(self):
        return split_prompts(load_prompts(self.config.prompts), self.config.holdout, self.config.sampling.seed,
                             self.config.num_prompts)

    def _drafter_config(self, target, mask_token_id: int, tap_layer_ids: list[int]) -> DrafterConfig:
        return DrafterConfig.for_target(target, variant=self.config.variant, num_layers=self.config.num_layers,
                                        block_size=self.config.block_size, mask_token_id=mask_token_id,
                                        target_layer_ids=tap_layer_ids)

    # --- stages --------------------------------------------------------------------------------

    def _prepare(self) -> dict:
        target = self._load_target()
        train_prompts, holdout = self._prompts()  # validates the prompts file before any compute
        mask_token_id, reason = (self.config.mask_token_id, "given") if self.config.mask_token_id is not None \
            else choose_mask_token_id(target.tokenizer, target.vocab_size)
        taps = default_target_layer_ids(target.num_layers, self.config.num_layers)
        self._drafter_config(target, mask_token_id, taps)  # validates the drafter shape now
        return {"target_path": str(target.path), "fingerprint": target.fingerprint, "mask_token_id": mask_token_id,
                "mask_token_rule": reason, "tap_layer_ids": taps, "train_prompts": len(train_prompts),
                "holdout_prompts": len(holdout)}

    def _generate(self) -> dict:
        target = self._load_target()
        train_prompts, _ = self._prompts()
        taps = self.state["stages"]["prepare"]["tap_layer_ids"]

        def on_progress(done: int, total: int, tokens: int) -> None:
            self.progress("generate", done / total, f"{done}/{total} prompts, {tokens} tokens")

        store = regenerate(target, train_prompts, self.config.sampling, self.work / "data", tap_layer_ids=taps,
                           cache_budget_bytes=self.config.cache_budget_mb << 20,
                           batch_size=self.config.generation_batch_size, on_progress=on_progress)
        return {"plan": store.meta["plan"], **store.summary()}

    def _train(self) -> dict:
        target = self._load_target()
        cfg, prepared = self.config.train, self.state["stages"]["prepare"]

        def on_step(record: dict) -> None:
            fraction = record["step"] / cfg.steps
            if cfg.max_minutes:
                fraction = max(fraction, record["elapsed_s"] / (cfg.max_minutes * 60))
            self.progress("train", min(fraction, 1.0), f"step {record['step']} loss {record['loss']:.3f} "
                          f"tau~{record['train_tau_estimate']:.2f} {record['tokens_per_s']:.0f} tok/s")

        trainer = Trainer(target, DataStore.open(self.work / "data"), self.work / "train",
                          self._drafter_config(target, prepared["mask_token_id"], prepared["tap_layer_ids"]), cfg,
                          [on_step])
        trainer.run(resume=(self.work / "train" / "checkpoints" / "latest").is_file())
        records = (self.work / "train" / "metrics.jsonl").read_text().splitlines()
        last = json.loads(records[-1])
        return {"steps": last["step"], "final_loss": last["loss"], "train_tau_estimate": last["train_tau_estimate"]}

    def _validate(self) -> dict:
        target = self._load_target()
        _, holdout = self._prompts()
        drafter = load_drafter(self.work / "train" / "drafter", target.device, target.dtype)
        prompts = holdout[:self.config.validation_prompts]

        def on_progress(done: int, total: int) -> None:
            self.progress("validate", done / (total + 1), f"{done}/{total} prompts")

        report = validate(target, drafter, prompts, self.config.sampling,
                          max_new_tokens=self.config.validation_max_new_tokens,
                          sampling_draws=self.config.sampling_draws, on_progress=on_progress)
        atomic_write_json(self.work / "report.json", report)
        require_passed(report)  # a drafter that changes the output is never exported
        return {"tau": report["tau"], "speedup": report["speedup"]["ratio"]}

    def _export(self) -> dict:
        target = self._load_target()
        report = json.loads((self.work / "report.json").read_text())
        manifest = export_artifacts(self.work / "train" / "drafter", target, self.out, report=report,
                                    metrics_file=self.work / "train" / "metrics.jsonl",
                                    target_name=self.config.target)
        return {"files": len(manifest["files"])}
