"""Where a job's target runs, as settings: the job spec's `compute.device` / `compute.dtype`, the worker's
DRAFTSMITH_WORKER_DEVICE and the `--device` / `--dtype` flags all take these strings. Pure (no torch): the API
validates them without the ML stack; trainer/device.py turns them into a device (`resolve_device`).

Who decides: the job says what it needs, the worker says what it has. `auto` on either side defers to the other; a
job may always ask for `cpu` (every worker has one); `cuda` agrees with any `cuda:N` (the specific one wins); a job
asking `cuda...` of a worker set to `cpu`, or two different `cuda:N`, conflict and the stage fails naming
`device`. A job left at `auto` runs on whatever its worker is set to (itself `auto` by default: every visible GPU,
else the CPU).
"""

from __future__ import annotations

import re
from typing import Literal, get_args

DEVICE_AUTO = "auto"
DEVICE_SETTINGS = "auto (every visible GPU, else the CPU), cpu, cuda (the visible GPUs) or cuda:N (GPU number N)"
"""What a device setting may say, in the words every error and description uses."""
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda)(?::(\d{1,4}))?$")

Dtype = Literal["auto", "float32"]
DTYPES: tuple[str, ...] = get_args(Dtype)
DTYPE_SETTINGS = ("auto (bfloat16 on a GPU, float32 on a CPU) or float32 (float32 everywhere: slower on a GPU, "
                  "and the greedy check then compares against the plain float32 decode)")


def check_device_setting(value: str, field: str = "device") -> str:
    """`value` if it is a device setting, else ValueError naming `field` and the accepted values."""
    match = _DEVICE_RE.match(value.strip().lower()) if isinstance(value, str) else None
    if match is None or (match[2] is not None and match[1] != "cuda"):
        raise ValueError(f"{field} {value!r} is not a device; use {DEVICE_SETTINGS}")
    return value.strip().lower()


def device_kind(setting: str) -> tuple[str, int | None]:
    """('auto' | 'cpu' | 'cuda', the GPU number or None) of a checked setting."""
    kind, _, index = check_device_setting(setting).partition(":")
    return kind, int(index) if index else None


def combine_device_settings(job: str, worker: str) -> str:
    """The one setting a stage runs with, from the job's and the worker's (module docstring). ValueError on a
    conflict, naming both."""
    job, worker = check_device_setting(job), check_device_setting(worker, "DRAFTSMITH_WORKER_DEVICE")
    if job == DEVICE_AUTO or job == worker:
        return worker
    if worker == DEVICE_AUTO or job == "cpu":
        return job
    (job_kind, job_index), (worker_kind, worker_index) = device_kind(job), device_kind(worker)
    if job_kind == worker_kind == "cuda" and None in (job_index, worker_index):
        return job if job_index is not None else worker
    raise ValueError(f"the job's device {job!r} conflicts with this worker's DRAFTSMITH_WORKER_DEVICE={worker!r}; "
                     f"set the job's compute.device to auto (or {worker!r}), or run it on a worker that has {job!r}")
