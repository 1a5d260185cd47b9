"""The one device decision: which device and precision the target (and so every stage) runs with.

`resolve_device(setting, dtype)` turns the settings of schemas/compute.py (the job's `compute.device`, combined with
the worker's DRAFTSMITH_WORKER_DEVICE, or a `--device` flag) into a `DevicePlan`. Everything that loads a target
goes through it: the pipeline's `load_job_target` (every stage, and each training rank), `draftsmith audit` and the
worker's audits (trainer/audit.py), and the per-stage commands (trainer/cli.py). Training's distributed setup takes
its device from the loaded target (trainer/training/distributed.py), so it cannot disagree.

Precision: bfloat16 on a GPU unless the job asks for float32; float32 on the CPU, always (today's CPU behaviour,
token for token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.compute import DEVICE_AUTO, DTYPES, combine_device_settings, device_kind
from trainer.errors import DraftsmithError


class DeviceUnavailable(DraftsmithError):
    """The job asked for a device this machine does not have (or two settings conflict)."""

    code = "device_unavailable"


@dataclass(frozen=True)
class DevicePlan:
    setting: str
    """The setting this plan was resolved from (after combining the job's and the worker's)."""
    device: torch.device
    """Where this process loads the target: the CPU, or one GPU (training ranks: their own, `for_rank`)."""
    dtype: torch.dtype
    name: str
    """What the device is: `cpu`, or the GPU's product name."""
    count: int
    """Devices the job may spread over (training's processes): the visible GPUs for auto/cuda, else 1."""

    def describe(self) -> dict:
        """The plan as report.json, the stage summaries and the model card record it."""
        return {"setting": self.setting, "device": str(self.device), "type": self.device.type, "name": self.name,
                "count": self.count, "dtype": str(self.dtype).removeprefix("torch.")}

    def summary(self) -> str:
        """One line for a stage event: `cuda:0 (NVIDIA H200 x8, bfloat16)`."""
        many = f" x{self.count}" if self.count > 1 else ""
        return f"{self.device} ({self.name}{many}, {str(self.dtype).removeprefix('torch.')})"

    def for_rank(self, local_rank: int) -> DevicePlan:
        """The plan of one training rank: rank r of a GPU job uses GPU r of the plan's."""
        if self.device.type != "cuda" or local_rank == 0 and self.count == 1:
            return self
        if self.count == 1:
            raise DeviceUnavailable(f"device {self.setting!r} names one GPU, but training runs {local_rank + 1}+ "
                                    "processes; set device to cuda or auto to train on several GPUs")
        if local_rank >= self.count:
            raise DeviceUnavailable(f"training rank {local_rank} has no GPU: this machine shows {self.count}; "
                                    "lower the processes per machine (DRAFTSMITH_WORKER_NPROC / --nproc)")
        return DevicePlan(self.setting, torch.device("cuda", local_rank), self.dtype,
                          _gpu_name(local_rank), self.count)


def resolve_device(setting: str = DEVICE_AUTO, dtype: str = "auto", *, worker: str = DEVICE_AUTO,
                   cuda_devices: int | None = None) -> DevicePlan:
    """The plan for a job's `setting` and `dtype` on a worker set to `worker` (schemas/compute.py: how the two
    combine). `cuda_devices`: GPUs visible here (None: ask torch; tests pass a number). Raises DeviceUnavailable,
    naming `device` and the fix, for a setting this machine cannot honour."""
    try:
        combined = combine_device_settings(setting, worker)
    except ValueError as error:
        raise DeviceUnavailable(str(error)) from None
    if dtype not in DTYPES:
        raise DeviceUnavailable(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    visible = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    kind, index = device_kind(combined)
    if kind == "auto":
        kind = "cuda" if visible else "cpu"
    if kind == "cpu":
        # float32 on a CPU whatever the job says: bfloat16 matmuls are slower there, and today's results stay exact.
        return DevicePlan(combined, torch.device("cpu"), torch.float32, "cpu", 1)
    if not visible:
        why = "this torch is built without CUDA" if torch.version.cuda is None else "CUDA found no device"
        raise DeviceUnavailable(f"device {combined!r} needs a GPU, and this machine shows none ({why}); "
                                "set device to auto or cpu, or run the job on a GPU worker")
    if index is not None and index >= visible:
        raise DeviceUnavailable(f"device {combined!r}: this machine shows {visible} GPU(s), numbered 0-{visible - 1}; "
                                "set device to cuda (every visible GPU) or a number in that range")
    device = torch.device("cuda", index or 0)
    return DevicePlan(combined, device, torch.float32 if dtype == "float32" else torch.bfloat16,
                      _gpu_name(device.index), 1 if index is not None else visible)


def _gpu_name(index: int) -> str:
    try:
        return torch.cuda.get_device_name(index)
    except (AssertionError, RuntimeError):  # tests resolve GPU plans on machines without one
        return "cuda"


def plan_of(device: torch.device, dtype: torch.dtype) -> DevicePlan:
    """The plan of a target loaded without one (a caller that placed it itself): what it runs on, count 1."""
    name = _gpu_name(device.index or 0) if device.type == "cuda" else "cpu"
    return DevicePlan(str(device), device, dtype, name, 1)


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work, so a clock read after it measures the work (GPU kernels run
    asynchronously); nothing to wait for on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_target_on(path, device: str = DEVICE_AUTO, dtype: str = "auto", **options):
    """A target directory loaded where `device`/`dtype` resolve to, for callers that need the target, not the plan
    (the per-stage commands, the benches); `options` go to load_target (allow_pickle, ...). A target too large for
    one GPU is split over the plan's GPUs (trainer/targets/placement.py), never beyond a setting that names one."""
    from trainer.targets import load_target
    from trainer.targets.adapters import suggested_base

    plan = resolve_device(device, dtype)
    options.setdefault("may_split", plan.count > 1)
    if options.get("base") is None:  # these commands run on one's own files: an adapter's base as it names it
        options["base"] = suggested_base(path)
    return load_target(path, device=plan.device, dtype=plan.dtype, **options)
