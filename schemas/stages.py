"""Stage names: the one list the API (job states, stage runs), the trainer (`draftsmith run`) and the
worker (Celery queues) all derive from.

    prepare → generate → train → validate → export → publish

`draftsmith run` runs every stage but publish locally (its export directory is the publication);
the service runs all six. Stages that need the accelerator go to the `gpu` queue, packaging and
uploads to the `cpu` queue, so GPU machines never wait on network copies.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Stage(StrEnum):
    PREPARE = "prepare"
    GENERATE = "generate"
    TRAIN = "train"
    VALIDATE = "validate"
    EXPORT = "export"
    PUBLISH = "publish"


STAGE_ORDER: tuple[Stage, ...] = tuple(Stage)
LOCAL_STAGES: tuple[Stage, ...] = STAGE_ORDER[:-1]
"""What `draftsmith run` executes: everything up to and including export."""

QueueKind = Literal["gpu", "cpu"]
STAGE_QUEUE: dict[Stage, QueueKind] = {
    Stage.PREPARE: "gpu",  # loads and checks the target where it will run
    Stage.GENERATE: "gpu",
    Stage.TRAIN: "gpu",
    Stage.VALIDATE: "gpu",
    Stage.EXPORT: "cpu",
    Stage.PUBLISH: "cpu",
}

GenerateBackend = Literal["builtin", "vllm"]
"""What writes the generate stage's responses (a deployment's choice, DRAFTSMITH_WORKER_GENERATE_BACKEND):
`builtin`, the target's own batched loop that captures the hidden states as it goes, or `vllm`, the vLLM engine,
after which one teacher-forced pass of the target captures them (trainer/data/vllm_backend.py)."""
GENERATE_BACKENDS: tuple[str, ...] = get_args(GenerateBackend)
