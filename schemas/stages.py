"""Stage names: the one list the API (job states, stage runs), the trainer (`draftsmith run`) and the
worker (Celery queues) all derive from.

    prepare → generate → train → validate → export → publish

`draftsmith run` runs every stage but publish locally (its export directory is the publication);
the service runs all six. Stages that need the accelerator go to the `gpu` queue, packaging and
uploads to the `cpu` queue, so GPU machines never wait on network copies.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


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
