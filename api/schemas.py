"""Request and response bodies of the REST API (the job spec itself lives in schemas/job_spec.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, HttpUrl

from domain.statuses import AuditStatus, JobStatus, StageRunStatus
from domain.webhooks import WEBHOOK_EVENT_TYPES
from schemas.bounds import JsonBody, MultilineText
from schemas.job_spec import JobSpec

WebhookEventType = Literal["job.started", "job.stage_changed", "job.succeeded", "job.failed", "job.cancelled"]
assert set(WebhookEventType.__args__) == set(WEBHOOK_EVENT_TYPES)  # type: ignore[attr-defined]
# The status names, from the one list of each (domain/statuses.py), in its order: the OpenAPI enum, the response
# models and the job list's filter all read these.
JobStatusName = Literal[tuple(status.value for status in JobStatus)]  # type: ignore[misc]
AuditStatusName = Literal[tuple(status.value for status in AuditStatus)]  # type: ignore[misc]
StageRunStatusName = Literal["running", "succeeded", "failed", "cancelled", "abandoned"]
assert StageRunStatusName.__args__ == tuple(StageRunStatus)  # type: ignore[attr-defined]


class JobError(BaseModel):
    code: str = Field(description="Machine-readable cause, e.g. `target_not_found`, `oom`, `enqueue_failed`.")
    message: str
    stage: str | None = Field(description="The stage that failed, where the job resumes from.")


class StageRunOut(BaseModel):
    id: str
    stage: str
    attempt: int
    status: StageRunStatusName
    progress: float | None = Field(description="Percent complete reported by the worker, 0-100.")
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    error_code: str | None
    error_message: str | None


class PublicationOut(BaseModel):
    kind: Literal["s3", "hf"]
    location: str = Field(description="s3://bucket/prefix, or the Hub repo URL.")
    revision: str | None = Field(description="The Hub commit sha; for S3 the sha256 of the published manifest.")
    url: str | None = Field(description="Where to look: the Hub commit page, or the manifest's S3 URI.")
    created_at: datetime


class JobOut(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobStatusName
    status_text: str = Field(description="The status in words, as the CLI and the dashboard show it: "
                             "`waiting` reads \"waiting for a worker\" (its worker went quiet and it was queued "
                             "again); every other status reads as its name.")
    stage: str | None = Field(description="The stage running now, or the last one that ran.")
    stage_progress: float | None = Field(description="Percent complete of `stage`, when the worker reports it.")
    name: str | None
    labels: dict[str, str]
    spec: JobSpec
    error: JobError | None
    cancel_requested: bool
    resume_count: int
    run_attempts: int = Field(description="Times a worker picked the job up: 1, plus one per redelivery after a "
                              "lost worker, per retry after an infrastructure error and per resume.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    stages: list[StageRunOut] = Field(description="Every stage attempt, oldest first.")
    publications: list[PublicationOut] = Field(default_factory=list, description="Where the artifacts were published.")


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobOut]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `after` to get the next page; null on the last page.")


class EventOut(BaseModel):
    id: int = Field(description="Per-job sequence number, 1, 2, 3...; the SSE `id:` line.")
    created_at: datetime
    type: str
    level: Literal["debug", "info", "warning", "error"]
    stage: str | None
    message: str
    progress: float | None
    data: dict[str, Any] | None


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EventOut]
    has_more: bool
    next_cursor: int | None = Field(description="Pass as `after` for the next page (the last event's id).")
    job_status: str


class MetricPointOut(BaseModel):
    step: int
    value: float | None = Field(description="Mean over the bucket when downsampled; null for a non-finite value.")


class MetricSeries(BaseModel):
    name: str
    points: list[MetricPointOut]
    total_points: int = Field(description="Points recorded in the requested step range, before downsampling.")
    downsampled: bool


class MetricsOut(BaseModel):
    job_id: str
    max_points: int
    series: list[MetricSeries]


class ArtifactOut(BaseModel):
    id: str
    object: Literal["artifact"] = "artifact"
    name: str
    kind: str
    stage: str | None
    size_bytes: int
    sha256: str
    content_type: str
    created_at: datetime
    download_path: str = Field(description="GET this path (with your key) to download; S3 storage answers 307.")


class ArtifactList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ArtifactOut]


class FileOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: Literal["prompts"]
    bytes: int
    sha256: str
    prompt_count: int
    created_at: datetime


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileOut]


class WebhookCreate(JsonBody):
    url: HttpUrl = Field(description="http(s) endpoint receiving signed POSTs.")
    events: list[WebhookEventType] = Field(
        default_factory=lambda: list(WEBHOOK_EVENT_TYPES), min_length=1, description="Events to send; default all."
    )
    description: MultilineText | None = Field(default=None, max_length=500)
    enabled: bool = True


class WebhookUpdate(JsonBody):
    url: HttpUrl | None = None
    events: list[WebhookEventType] | None = Field(default=None, min_length=1)
    description: MultilineText | None = Field(default=None, max_length=500)
    enabled: bool | None = None


class WebhookOut(BaseModel):
    id: str
    object: Literal["webhook"] = "webhook"
    url: str
    events: list[str]
    description: str | None
    enabled: bool
    created_at: datetime
    updated_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="`whsec_...` signing secret. Shown only in this response: store it now.")


class WebhookList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookOut]


class WebhookAttemptOut(BaseModel):
    attempt: int
    attempted_at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int
    succeeded: bool


class WebhookDeliveryOut(BaseModel):
    id: str = Field(description="The `webhook-id` header value, identical across retries.")
    event_type: str
    job_id: str | None
    status: Literal["pending", "succeeded", "failed"]
    attempt_count: int
    next_attempt_at: datetime | None
    created_at: datetime
    attempts: list[WebhookAttemptOut]


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDeliveryOut]


class TrainingMemoryEstimate(BaseModel):
    """One training step's peak GPU memory, per GPU (schemas/train_memory.py: what each term counts)."""

    peak_gb: float = Field(description="Target weights + drafter states + activations + attention, per GPU.")
    target_weights_gb: float
    drafter_states_gb: float = Field(description="Drafter weights, gradients and AdamW state (ZeRO-sharded).")
    attention_gb: float = Field(description="Training attention on the fused (memory-efficient) kernel: one "
                                "additive mask for the step, K/V expanded to the query heads per layer.")
    activations_gb: float
    math_attention_gb: float = Field(description="What attention alone would hold on the float32 math kernel "
                                     "(every score of every layer), for comparison.")
    attention_kernel: Literal["memory-efficient SDPA"]
    gpu_count: int
    assumed_shape: str = Field(description="The published model whose shape the drafter is sized from.")
    sequence_tokens: int = Field(description="Assumed tokens per training sequence (a prompt + max_new_tokens).")
    block_queries: int = Field(description="Block tokens per sequence: anchors x block size.")


class GpuEstimate(BaseModel):
    gpu_class: str
    gpu_count: int
    price_per_gpu_hour_usd: float
    generation_minutes: float
    training_minutes: float
    validation_minutes: float
    overhead_minutes: float
    total_minutes: float
    cost_usd: float
    training_limited_by: Literal["max_steps", "max_minutes"]
    training_peak_memory_gb: float = Field(description="One training step's peak memory on each of gpu_count GPUs.")
    training_fits: bool = Field(description="training_peak_memory_gb is within this GPU class's memory.")


class PresetEstimate(BaseModel):
    """The same job laid over one recipe preset (schemas/presets.py): the preset fills what the spec leaves unset."""

    preset: Literal["cpu", "gpu"]
    fields: dict[str, Any] = Field(description="The JobSpec fields this preset set (dotted names); fields the spec "
                                   "gives itself keep their values.")
    prompts: int
    tokens_to_generate: int
    training_steps: int
    drafter_tokens_per_step: int
    training_memory: TrainingMemoryEstimate
    estimates: list[GpuEstimate]
    notes: list[str] = Field(description="How the preset was sized.")


class EstimateOut(BaseModel):
    prompts: int
    holdout_prompts: int
    tokens_to_generate: int = Field(description="Upper bound: every prompt answered to max_new_tokens.")
    training_steps: int
    drafter_tokens_per_step: int
    target_parameters_billion: float = Field(description="The target's size: what its weights take in memory.")
    target_active_parameters_billion: float = Field(
        description="Parameters a token runs through (a mixture of experts' active share; the size for a dense "
        "model): generation, training and validation time scale with these.")
    training_memory: TrainingMemoryEstimate = Field(description="One training step's peak GPU memory on one GPU.")
    estimates: list[GpuEstimate]
    assumptions: list[str]
    presets: list[PresetEstimate] = Field(
        default_factory=list, description="The job priced under each recipe preset: `cpu` (the 20-minute main job's "
        "recipe) and `gpu` (the published DFlash recipe sized for gpu_count GPUs), as `draftsmith run --preset` "
        "would run it.")


class HealthOut(BaseModel):
    status: Literal["ok"]


class SlowClientOut(BaseModel):
    client: str
    body_timeouts: int


class CapacityOut(BaseModel):
    """This API process's admission control (api/admission.py): how busy it is, and who has been refused. Every
    number is the answering process's own (`pid`): under `draftsmith api --workers N` each process counts for
    itself, and a request reaches whichever one the kernel hands it to. `/readyz`'s `processes` lists every
    process's counters, and their totals."""

    pid: int = Field(description="The API process whose counters these are. With several workers, successive "
                     "answers may come from different processes; group them by pid before comparing or adding.")

    slots: int = Field(description="Requests this process handles at once (2 x DRAFTSMITH_API_WORKER_THREADS).")
    in_progress: int
    waiting: int = Field(description="Admitted requests (key checked, body received) waiting for a slot.")
    saturated: bool = Field(description="New requests wait: every slot is taken (they are refused 503 after "
                            "DRAFTSMITH_API_QUEUE_TIMEOUT_SECONDS), or every worker thread is busy with work waiting "
                            "for one, or every database connection is in use, or a request is `stalled`.")
    refused_total: int = Field(description="Requests answered 503 because no slot came free in time.")
    unauthenticated_total: int = Field(description="Requests refused 401 before they could wait for a slot.")
    body_timeouts_total: int = Field(description="Bodies that did not arrive within DRAFTSMITH_API_BODY_TIMEOUT_"
                                     "SECONDS (408).")
    slow_clients: list[SlowClientOut] = Field(description="The clients with the most body timeouts.")
    threads: int = Field(0, description="Worker threads of this process (DRAFTSMITH_API_WORKER_THREADS): sync "
                         "routes and all database work run on them.")
    threads_busy: int = Field(0, description="Worker threads in use now.")
    threads_waiting: int = Field(0, description="Tasks waiting for a worker thread.")
    database_connections: int = Field(0, description="The most database connections this process may hold (its "
                                      "pool and overflow); 0 when the pool does not count them.")
    database_connections_in_use: int = Field(0, description="Database connections checked out now.")
    oldest_in_progress_seconds: float = Field(0.0, description="How long the oldest request holding a slot has "
                                              "held it without starting its response.")
    stalled: int = Field(0, description="Requests holding a slot for longer than DRAFTSMITH_API_STALLED_REQUEST_"
                         "SECONDS (waiting on a lock, a connection or another dependency). While any is, `saturated` "
                         "is true and /readyz answers 503 `not-ready`.")


class ProcessCapacityOut(CapacityOut):
    age_seconds: float = Field(description="How long ago that process wrote these numbers: 0 for the process that "
                               "answered; the others write theirs every 2 s (and at each /readyz they answer).")


class ProcessesOut(BaseModel):
    """Every API process of this server (`draftsmith api --workers N`): each keeps its own counters, so `capacity`
    is one process's; this lists them all, as each last wrote them, and adds them up."""

    answered_by: int = Field(description="The pid of the process that answered (as `capacity.pid`).")
    configured: int | None = Field(description="Worker processes the server was started with (`draftsmith api "
                                   "--workers`); null when it was not started by `draftsmith api`, and then "
                                   "`reporting` lists the answering process only.")
    reporting: list[ProcessCapacityOut] = Field(description="One entry per live API process, by pid.")
    totals: dict[str, int] = Field(description="`in_progress`, `waiting`, `refused_total`, `unauthenticated_total`, "
                                   "`body_timeouts_total` and `stalled` summed over `reporting`.")


class ReadinessOut(BaseModel):
    status: Literal["ready"]
    checks: dict[str, str]
    capacity: CapacityOut | None = None
    processes: ProcessesOut | None = None


class DrafterTarget(BaseModel):
    uri: str
    revision: str | None = Field(description="The exact version trained for: a Hub commit, an S3 digest.")
    fingerprint: str = Field(description="Hash of the target's tokenizer and embedding.")


class DrafterParent(BaseModel):
    id: str | None = Field(description="The parent drafter's id, when it is one of your organisation's.")
    ref: str = Field(description="init.from_drafter as the job gave it.")


class DrafterOut(BaseModel):
    id: str
    object: Literal["drafter"] = "drafter"
    job_id: str
    name: str | None
    created_at: datetime
    target: DrafterTarget
    parent: DrafterParent | None
    variant: str
    block_size: int
    num_layers: int
    tau: float | None = Field(description="Held-out tau at validation, bonus token counted.")
    lossless: bool
    config: dict[str, Any] = Field(description="The drafter's shape: hidden and vocabulary size, taps, mask token...")
    metrics: dict[str, Any]
    lineage: dict[str, Any] = Field(description="data snapshot, recipe, code and package versions")
    manifest_sha256: str
    artifacts_path: str = Field(description="GET this path for the drafter's files (safetensors, GGUF, card, report).")
    publications: list[dict[str, Any]]


class DrafterLink(BaseModel):
    id: str
    job_id: str
    created_at: datetime
    target_uri: str
    target_revision: str | None
    tau: float | None
    parent_ref: str | None


class DrafterDetail(DrafterOut):
    chain: list[DrafterLink] = Field(description="This drafter, its parent, the parent's parent... oldest last.")


class DrafterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DrafterOut]
    has_more: bool
    next_cursor: str | None


class AuditError(BaseModel):
    code: str
    message: str


class AuditOut(BaseModel):
    id: str
    object: Literal["audit"] = "audit"
    status: AuditStatusName
    drafter: str = Field(description="The drafter audited, as given (an id or a URI).")
    drafter_id: str | None
    target_uri: str
    target_revision: str | None = Field(description="The exact checkpoint measured (a Hub commit, an S3 digest).")
    recommendation: Literal["keep", "warm_start", "retrain"] | None
    result: dict[str, Any] | None = Field(description="Compatibility, lossless checks, tau overall, per position "
                                          "and per category, the reference tau and the recommendation's reasons.")
    error: AuditError | None
    spec: dict[str, Any] = Field(description="The audit as admitted, every default resolved.")
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class AuditList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditOut]
    has_more: bool
    next_cursor: str | None
