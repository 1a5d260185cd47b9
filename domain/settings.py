"""The one settings object of the control plane.

Sources, highest priority first: keyword arguments (tests), `DRAFTSMITH_*` environment variables,
the file named by `DRAFTSMITH_SETTINGS_FILE` (.toml, .json or dotenv syntax), then defaults.
Defaults are the embedded setup (SQLite file, file-backed broker, local directory storage) and
are only acceptable with `DRAFTSMITH_ENV=development`: any other environment refuses to start
with the built-in secret key, so a forgotten setting fails loudly instead of shipping a known key.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    JsonConfigSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from schemas.bounds import TargetLimits
from schemas.compute import DEVICE_SETTINGS, check_device_setting
from schemas.stages import GenerateBackend

DEFAULT_SECRET_KEY = "insecure-development-secret-key-change-me"
DEFAULT_DEV_API_KEY = "dsk_dev_local_development_key"
SETTINGS_FILE_ENV = "DRAFTSMITH_SETTINGS_FILE"
SECRETS_DIR_ENV = "DRAFTSMITH_SECRETS_DIR"
DISABLED_BROKER = "disabled"
# A development setup's webhooks and S3 endpoints may be on the operator's own machine or network.
DEVELOPMENT_EGRESS_NETWORKS = ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


def _default_storage_url() -> str:
    return Path(".draftsmith/storage").resolve().as_uri()


class Settings(BaseSettings):
    # extra="ignore": one settings file may also carry keys of other components (the worker's).
    model_config = SettingsConfigDict(env_prefix="DRAFTSMITH_", extra="ignore", validate_default=True)

    env: Literal["development", "production"] = Field(
        default="production",
        description="`development` enables the local API key and tolerates default secrets.",
    )
    database_url: str = Field(
        default="sqlite:///./.draftsmith/draftsmith.db",
        description="SQLAlchemy URL: sqlite:///path or postgresql://user@host/db (psycopg 3 driver).",
    )
    database_echo: bool = False
    broker_url: str = Field(
        default="filesystem://",
        description="Celery broker: redis://host:6379/0, filesystem:// (embedded) or `disabled` "
        "(jobs are recorded in memory and never run; for tests).",
    )
    broker_folder: str = Field(
        default=".draftsmith/broker", description="Message folder of the filesystem:// broker."
    )
    queue_name: str = Field(default="draftsmith", description="Prefix of the Celery queues: <name>.gpu and <name>.cpu.")
    storage_url: str = Field(
        default_factory=_default_storage_url,
        description="Artifact and upload storage: file:///absolute/dir or s3://bucket/prefix.",
    )
    s3_endpoint_url: str | None = Field(default=None, description="Any S3-compatible endpoint.")
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    presigned_url_ttl_seconds: int = Field(default=900, ge=30, le=7 * 24 * 3600)
    s3_trusted_buckets: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Buckets (comma-separated; * for all) that jobs may read and publish to with the deployment's "
        "own S3 credentials, e.g. a shared models bucket. Any other bucket is reached only with the organisation's "
        "own secret (credentials_secret, else secrets named s3.<bucket> or s3), or anonymously for reads. "
        "Unset in development (one local organisation on the operator's machine): *.",
    )

    secret_key: SecretStr = Field(
        default=SecretStr(DEFAULT_SECRET_KEY),
        description="Pepper for API-key hashes; at least 32 characters outside development. "
        "Changing it invalidates every issued key.",
    )
    dev_api_key: SecretStr = Field(
        default=SecretStr(DEFAULT_DEV_API_KEY),
        description="The single local key accepted in development mode (organisation `local`, admin).",
    )
    dev_org_name: str = "local"

    allowed_file_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Absolute directories a job may reference with file:// (comma-separated). Empty: none.",
    )
    allow_trust_remote_code: bool = Field(
        default=False, description="Whether jobs may set target.trust_remote_code=true at all."
    )
    max_upload_bytes: int = Field(default=50 * 1024 * 1024, ge=1024)
    default_max_concurrent_jobs: int = Field(
        default=4, ge=1, description="Active (non-terminal) jobs per organisation unless the organisation overrides it."
    )
    default_monthly_compute_seconds: int | None = Field(
        default=None, ge=1, le=2**62,
        description="Compute seconds (wall x devices) an organisation may use per UTC month unless it has its own "
        "limit; unset: unlimited. Checked when a job, resume or audit is submitted (429 quota-exceeded).")
    default_monthly_tokens_generated: int | None = Field(
        default=None, ge=1, le=2**62, description="Tokens generated by targets per organisation per month; unset: unlimited.")
    default_monthly_tokens_trained: int | None = Field(
        default=None, ge=1, le=2**62, description="Drafter tokens trained per organisation per month; unset: unlimited.")

    sse_poll_interval_seconds: float = Field(default=0.5, gt=0, le=10)
    sse_keepalive_seconds: float = Field(default=15.0, gt=0)
    sse_max_stream_seconds: float = Field(
        default=600.0, gt=0, description="A stream closes after this long; clients reconnect with Last-Event-ID."
    )

    webhook_dispatch_interval_seconds: float = Field(
        default=2.0, ge=0, description="How often the API process sends due webhook deliveries; 0 disables the loop."
    )
    webhook_max_attempts: int = Field(default=8, ge=1, le=30)
    webhook_backoff_base_seconds: float = Field(default=5.0, gt=0)
    webhook_backoff_max_seconds: float = Field(default=3600.0, gt=0)
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    egress_allowed_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Networks (CIDR, comma-separated) that connections on an organisation's behalf (webhook "
        "deliveries, S3 endpoints of its secrets) may reach although they are not global unicast: a customers' "
        "network peered with this deployment, say. Cloud metadata endpoints and this deployment's own services stay "
        "refused. Unset in development: loopback and the private ranges (domain/egress.py).",
    )
    egress_denied_endpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="host:port of services of this deployment beyond the storage endpoint, database and broker "
        "(which are always refused): the API's own address, an internal dashboard. Comma-separated; IPv6 as "
        "[addr]:port.",
    )

    # --- capacity: the database pool is sized from the thread count (api/deps.py), so no thread waits for a
    # connection; overload is answered 503 + Retry-After instead of queueing without bound.
    api_worker_threads: int = Field(
        default=16, ge=1, le=512,
        description="Threads per API process for blocking work (database, storage); the database pool matches it.",
    )
    api_queue_timeout_seconds: float = Field(
        default=5.0, gt=0, le=60,
        description="A request that cannot start within this long is answered 503 with Retry-After.",
    )
    api_body_timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600,
        description="A request body must arrive whole within this long (408 otherwise); it is read before the "
        "request takes a slot, and only after its API key was checked.",
    )
    database_pool_timeout_seconds: float = Field(
        default=5.0, gt=0, le=60,
        description="Longest wait for a database connection before the request is answered 503 with Retry-After.",
    )
    database_statement_timeout_seconds: float = Field(
        default=30.0, ge=0, le=3600,
        description="PostgreSQL: longest an API statement may run, waits for locks included, before the database "
        "cancels it and the request is answered 503 with Retry-After. Set on every connection of the API's pool "
        "(libpq startup options); 0 leaves the server's setting (needed behind a pooler that refuses startup "
        "options, such as PgBouncer: set the limits on the database role instead).",
    )
    database_idle_in_transaction_timeout_seconds: float = Field(
        default=15.0, ge=0, le=3600,
        description="PostgreSQL: an API connection idle inside a transaction for this long is closed by the "
        "database, which rolls the transaction back and frees its row locks, so no stuck request can hold a lock "
        "that other requests wait for. 0 leaves the server's setting.",
    )
    api_stalled_request_seconds: float = Field(
        default=10.0, gt=0, le=3600,
        description="A request that has held a slot this long without starting its response is stalled (waiting "
        "on a lock, a database connection or a dependency): /readyz then reports the process saturated and "
        "answers 503 not-ready until no request is stalled.",
    )
    api_graceful_shutdown_seconds: float = Field(
        default=10.0, ge=0, le=600,
        description="On SIGTERM, `draftsmith api` waits this long for requests in progress to finish, then cancels "
        "them and their database statements and exits; keep it below the orchestrator's kill deadline "
        "(Kubernetes: terminationGracePeriodSeconds, 30 s by default).",
    )

    # --- the worker (worker/) and publishing ---------------------------------------------------------
    secrets_key: SecretStr | None = Field(
        default=None,
        description="Key for organisation secrets at rest (PUT /v1/secrets); default: derived from secret_key. "
        "Set it separately so rotating secret_key (API keys) keeps stored secrets readable.",
    )
    worker_cache_dir: str = Field(
        default=".draftsmith/worker-cache",
        description="Worker-local cache: fetched targets and each job's files (object storage holds the truth).",
    )
    worker_heartbeat_seconds: float = Field(
        default=10.0, gt=0, le=300, description="How often a running stage refreshes its heartbeat and polls for "
        "cancellation."
    )
    worker_stale_after_seconds: float = Field(
        default=120.0, gt=0, description="A running stage whose heartbeat is older than this is taken over by "
        "another worker (its worker is presumed dead)."
    )
    worker_nproc: int = Field(default=1, ge=1, le=1024, description="Training processes per machine (GPUs).")
    worker_hostfile: str | None = Field(
        default=None, description="DeepSpeed hostfile: the train stage spans the nodes it lists."
    )
    worker_generate_workers: int = Field(
        default=1, ge=1, le=1024, description="GPU workers one job's generate stage spreads its shards over: the "
        "worker that runs the stage asks this many minus one others to claim shards beside it (1: it writes them all)."
    )
    worker_generate_backend: GenerateBackend = Field(
        default="builtin", description="What writes the regenerated responses: builtin (the target's batched loop) "
        "or vllm (vLLM installed beside the worker, as bench/setup/vllm_cpu.sh does; the target then captures the "
        "hidden states in one teacher-forced pass)."
    )
    worker_device: str = Field(
        default="auto", description=f"What this worker's stages run the target on: {DEVICE_SETTINGS}. A job's "
        "compute.device, when not auto, must agree with it (a job asking cuda of a worker set to cpu fails naming "
        "`device`); schemas/compute.py.",
    )
    target_max_parameters: int = Field(
        default=TargetLimits().max_parameters, ge=1,
        description="Largest target (parameters in its weight files) a worker loads; larger ones are refused at "
        "prepare from their headers, before anything is allocated."
    )
    target_max_layers: int = Field(default=TargetLimits().max_layers, ge=1,
                                   description="Most decoder layers a target's config.json may declare.")
    target_max_hidden_size: int = Field(default=TargetLimits().max_hidden_size, ge=1,
                                        description="Widest hidden, intermediate or head size a target may declare.")
    target_max_vocab_size: int = Field(default=TargetLimits().max_vocab_size, ge=1,
                                       description="Largest vocabulary a target may declare.")
    target_max_context: int = Field(default=TargetLimits().max_context, ge=1,
                                    description="Longest max_position_embeddings a target may declare.")
    target_max_heads: int = Field(default=TargetLimits().max_heads, ge=1,
                                  description="Most attention heads a target may declare.")
    target_max_experts: int = Field(default=TargetLimits().max_experts, ge=1,
                                    description="Most routed experts a target's MoE layers may declare.")
    worker_max_retries: int = Field(
        default=3, ge=0, le=20, description="Retries of a stage after an infrastructure error (database, broker, "
        "storage unreachable)."
    )
    worker_database_statement_timeout_seconds: float = Field(
        default=300.0, ge=0, le=86400,
        description="PostgreSQL: longest a worker statement may run; the worker's own limit, longer than the API's "
        "(no client waits on a worker statement, and a bulk delete, such as a resumed stage's metric points, may "
        "outlast a request). 0 leaves the server's setting.",
    )
    worker_database_idle_in_transaction_timeout_seconds: float = Field(
        default=0.0, ge=0, le=86400,
        description="PostgreSQL: a worker connection idle inside a transaction for this long is closed by the "
        "database. 0 (the default) leaves the server's setting: a stage's session may hold a read transaction open "
        "across a long transfer to or from object storage or the Hub (it takes no row lock there: every state change "
        "commits at once), and closing it would fail the stage.",
    )
    broker_visibility_timeout_seconds: int = Field(
        default=12 * 3600, ge=60, description="Redis: an unacknowledged task is redelivered after this long; "
        "longer than any stage."
    )
    hf_endpoint: str | None = Field(default=None, description="Hugging Face Hub endpoint (default huggingface.co).")
    hf_token: SecretStr | None = Field(
        default=None, description="The deployment's Hub token, sent only for DRAFTSMITH_HF_TRUSTED_NAMESPACES "
        "(fetching hf:// repos, publishing without an organisation token)."
    )
    hf_trusted_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hub namespaces (users or organisations, comma-separated; * for all) that jobs may read and "
        "publish to with the deployment's own Hub token, e.g. a namespace of shared base models. Any other repo is "
        "reached only with the organisation's own token (token_secret, else secrets named hf.<namespace> or hf), or "
        "anonymously for reads (public repos). Unset in development (one local organisation on the operator's "
        "machine): *.",
    )

    @field_validator("allowed_file_roots", "s3_trusted_buckets", "hf_trusted_namespaces", "egress_allowed_networks",
                     "egress_denied_endpoints", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("allowed_file_roots")
    @classmethod
    def _absolute_roots(cls, value: list[str]) -> list[str]:
        for root in value:
            if not root.startswith("/"):
                raise ValueError(f"allowed file root {root!r} must be an absolute path")
        return value

    @field_validator("egress_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"egress allowed network {network!r} is not a CIDR network such as 10.20.0.0/16") from None
        return value

    @field_validator("egress_denied_endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for endpoint in value:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"egress denied endpoint {endpoint!r} must be host:port (IPv6 as [addr]:port)")
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_scheme(cls, value: str) -> str:
        if not (value.startswith("file:///") or value.startswith("s3://")):
            raise ValueError("storage_url must be file:///absolute/dir or s3://bucket/prefix")
        return value

    @field_validator("worker_device")
    @classmethod
    def _device_setting(cls, value: str) -> str:
        return check_device_setting(value, "DRAFTSMITH_WORKER_DEVICE")

    @model_validator(mode="after")
    def _heartbeat_below_staleness(self) -> Settings:
        if self.worker_stale_after_seconds <= 2 * self.worker_heartbeat_seconds:
            raise ValueError("worker_stale_after_seconds must exceed twice worker_heartbeat_seconds, or live "
                             "workers would be taken for dead")
        return self

    @model_validator(mode="after")
    def _development_trusts_every_bucket_and_namespace(self) -> Settings:
        # A development setup is single-tenant: its one organisation is the operator, whose credentials these are.
        if self.env == "development" and "s3_trusted_buckets" not in self.model_fields_set:
            self.s3_trusted_buckets = ["*"]
        if self.env == "development" and "hf_trusted_namespaces" not in self.model_fields_set:
            self.hf_trusted_namespaces = ["*"]
        if self.env == "development" and "egress_allowed_networks" not in self.model_fields_set:
            self.egress_allowed_networks = list(DEVELOPMENT_EGRESS_NETWORKS)
        return self

    @model_validator(mode="after")
    def _no_default_secrets_outside_development(self) -> Settings:
        if self.env == "development":
            return self
        secret = self.secret_key.get_secret_value()
        if secret == DEFAULT_SECRET_KEY or len(secret) < 32:
            raise ValueError(
                "DRAFTSMITH_SECRET_KEY must be set to a random value of at least 32 characters "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`), "
                "or set DRAFTSMITH_ENV=development for a local setup"
            )
        return self

    @property
    def development(self) -> bool:
        return self.env == "development"

    @property
    def target_limits(self) -> TargetLimits:
        """The target_max_* settings as the trainer's preflight takes them."""
        return TargetLimits(**{name: getattr(self, f"target_{name}") for name in TargetLimits.model_fields})

    @property
    def broker_enabled(self) -> bool:
        return self.broker_url != DISABLED_BROKER

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        settings_file = os.environ.get(SETTINGS_FILE_ENV)
        if settings_file:
            path = Path(settings_file)
            if not path.is_file():
                raise ValueError(f"{SETTINGS_FILE_ENV}={settings_file} does not name a readable file")
            if path.suffix == ".toml":
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            elif path.suffix == ".json":
                sources.append(JsonConfigSettingsSource(settings_cls, json_file=path))
            else:  # KEY=value lines, with or without the DRAFTSMITH_ prefix
                sources.append(DotEnvSettingsSource(settings_cls, env_file=path))
        secrets_dir = os.environ.get(SECRETS_DIR_ENV)
        if secrets_dir:  # mounted secret files (Docker/Kubernetes): one file per setting, named like its variable
            if not Path(secrets_dir).is_dir():
                raise ValueError(f"{SECRETS_DIR_ENV}={secrets_dir} is not a directory")
            sources.append(SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir))
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (and settings file); keyword arguments win."""
    return Settings(**overrides)
