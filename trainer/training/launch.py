"""How the train stage runs: in this process for one device, or as a torchrun / DeepSpeed-launcher job
across the devices (and hosts) a machine is configured with. Both paths give the caller the same hooks:
every step's record, a `should_stop` poll, and `on_saved(path)` after each checkpoint and at the end.

In a launched job the ranks cannot call back into this process, so the contract runs through files:
rank 0 appends each step to metrics.jsonl (tailed here), DeepSpeed writes checkpoints/latest after a
checkpoint's files (watched here), and a stop file asks every rank to checkpoint and stop.

    python -m trainer.training.launch SPEC.json      # what each rank runs; SPEC is written by train_drafter
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from schemas.work_files import PreparedTarget, StepRecord
from trainer.errors import CheckpointMismatch, DraftsmithError, StageInterrupted

POLL_SECONDS = 1.0
STOP_FILE = "STOP"
REFUSAL_FILE = "launch-refusal.txt"
"""Rank 0's CheckpointMismatch message: every rank refuses alike, and the launcher raises it as itself, with its code,
rather than as a crash with a log tail."""


class TrainingFailed(DraftsmithError):
    code = "training_failed"


def training_command(nproc: int, hostfile: str | None, spec_file: Path, master_port: int) -> list[str]:
    """The launcher command for a multi-process train stage: DeepSpeed's launcher across the hosts of a
    hostfile (`host slots=N` lines; it starts the ranks over ssh/pdsh), torchrun on one machine."""
    if hostfile:
        return ["deepspeed", f"--hostfile={hostfile}", f"--master_port={master_port}", "--module",
                "trainer.training.launch", str(spec_file)]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            f"--master-port={master_port}", "-m", "trainer.training.launch", str(spec_file)]


def _trainer(config, prepared: PreparedTarget | Mapping[str, Any], data_dir: Path, run_dir: Path, target, callbacks, should_stop, on_saved):
    from trainer.data.store import DataStore
    from trainer.pipeline import drafter_config_for
    from trainer.training.loop import Trainer

    return Trainer(target, DataStore.open(data_dir), run_dir, drafter_config_for(config, target, prepared),
                   config.train, callbacks, should_stop=should_stop, on_saved=on_saved)


def train_drafter(config, prepared: PreparedTarget, data_dir: Path, run_dir: Path, launch, *, resume: bool,
                  on_step: Callable[[dict], None], should_stop: Callable[[], bool],
                  on_saved: Callable[[Path], None], target=None, plan=None) -> Path:
    """Train into run_dir (checkpoints/, metrics.jsonl, drafter/); return the drafter directory. `plan`: the job's
    DevicePlan on this machine (None: resolved here from the job and `launch.device`)."""
    if launch.nproc <= 1 and not launch.hostfile:
        if target is None:
            from trainer.pipeline import job_device_plan, load_job_target

            target = load_job_target(config, plan or job_device_plan(config, launch.device))
        trainer = _trainer(config, prepared, data_dir, run_dir, target, [on_step], should_stop, on_saved)
        return trainer.run(resume=resume)
    return _launch(config, prepared, data_dir, run_dir, launch, resume, on_step, should_stop, on_saved)


def _launch(config, prepared, data_dir, run_dir, launch, resume, on_step, should_stop, on_saved) -> Path:
    from trainer.atomic import atomic_write_json
    from trainer.training.distributed import LAUNCHER_VARIABLES, _free_port

    run_dir.mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / STOP_FILE
    stop_file.unlink(missing_ok=True)
    (run_dir / REFUSAL_FILE).unlink(missing_ok=True)
    spec_file = run_dir / "launch.json"
    atomic_write_json(spec_file, {"config": config.to_json(), "prepared": PreparedTarget.read(prepared).to_json(),
                                  "data_dir": str(data_dir), "run_dir": str(run_dir), "resume": resume, "machine_device": launch.device})
    # Ranks find their own RANK/WORLD_SIZE from the launcher; stale values from this process would confuse them.
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    log_file = run_dir / "launch.log"
    metrics, latest = run_dir / StepRecord.FILE, run_dir / "checkpoints" / "latest"
    # The ranks replay every step after the checkpoint they resume from; forward those again.
    seen_steps = int(latest.read_text().strip().removeprefix("step-")) if resume and latest.is_file() else 0
    latest_mtime = latest.stat().st_mtime_ns if latest.is_file() else None
    with log_file.open("ab") as log:
        process = subprocess.Popen(training_command(launch.nproc, launch.hostfile, spec_file, _free_port()),
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                finished = process.poll() is not None
                seen_steps = _forward_new_steps(metrics, seen_steps, on_step)
                if latest.is_file() and latest.stat().st_mtime_ns != latest_mtime:
                    latest_mtime = latest.stat().st_mtime_ns
                    on_saved(metrics)
                    on_saved(run_dir / "checkpoints")
                if finished:
                    break
                if not stop_file.exists() and should_stop():
                    stop_file.touch()
                time.sleep(POLL_SECONDS)
        finally:
            if process.poll() is None:  # this process is being torn down: don't leave ranks behind
                process.kill()
                process.wait()
    if stop_file.exists():
        stop_file.unlink()
        raise StageInterrupted("training stopped on request; the ranks wrote a checkpoint and the stage resumes "
                               "from it")
    if process.returncode != 0 and (run_dir / REFUSAL_FILE).is_file():
        raise CheckpointMismatch((run_dir / REFUSAL_FILE).read_text())
    if process.returncode != 0:
        tail = log_file.read_text(errors="replace")[-2000:]
        raise TrainingFailed(f"the training launcher exited with {process.returncode}; last output:\n{tail}")
    drafter_dir = run_dir / "drafter"
    on_saved(drafter_dir)
    return drafter_dir


def _forward_new_steps(metrics: Path, seen: int, on_step: Callable[[dict], None]) -> int:
    if not metrics.is_file():
        return seen
    for record in StepRecord.lines(metrics):  # a line still being written is not one yet
        if record.step > seen:
            on_step(record.values())
            seen = record.step
    return seen


def _rank_main(spec_file: str) -> None:
    """One rank of a launched train stage."""
    from trainer.pipeline import RunConfig, job_device_plan, load_job_target

    spec = json.loads(Path(spec_file).read_text())
    config, run_dir = RunConfig.from_json(spec["config"]), Path(spec["run_dir"])
    # The job's plan, as the stage resolved it; each rank takes its own GPU of it (the launcher's LOCAL_RANK).
    plan = job_device_plan(config, spec.get("machine_device", "auto")).for_rank(int(os.environ.get("LOCAL_RANK", 0)))
    target = load_job_target(config, plan)
    stop_file = run_dir / STOP_FILE
    trainer = _trainer(config, spec["prepared"], Path(spec["data_dir"]), run_dir, target, [],
                       stop_file.exists, None)
    try:
        trainer.run(resume=spec["resume"])
    except StageInterrupted:
        sys.exit(3)
    except CheckpointMismatch as error:
        if os.environ.get("RANK", "0") == "0":
            from trainer.atomic import atomic_write_bytes

            atomic_write_bytes(run_dir / REFUSAL_FILE, str(error).encode())
        sys.exit(4)


if __name__ == "__main__":
    _rank_main(sys.argv[1])
