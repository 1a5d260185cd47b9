"""The one settings object of the control plane.

Sources, highest priority first: keyword arguments (tests), `DRAFTSMITH_*` environment variables,
the file named by `DRAFTSMITH_SETTINGS_FILE` (.toml, .json or dotenv syntax), then defaults.
Defaults are the embedded setup (SQLite file, file-backed broker, local directory storage) and
are only acceptable with `DRAFTSMITH_ENV=development`: any other environment refuses to start
with the built-in secret key, so a forgotten setting fails loudly instead of shipping a known key.
"""

from __future__ import annotations

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
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_SECRET_KEY = "insecure-development-secret-key-change-me"
DEFAULT_DEV_API_KEY = "dsk_dev_local_development_key"
SETTINGS_FILE_ENV = "DRAFTSMITH_SETTINGS_FILE"
DISABLED_BROKER = "disabled"


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
    queue_name: str = Field(default="draftsmith", description="Celery queue the worker consumes.")
    storage_url: str = Field(
        default_factory=_default_storage_url,
        description="Artifact and upload storage: file:///absolute/dir or s3://bucket/prefix.",
    )
    s3_endpoint_url: str | None = Field(default=None, description="Any S3-compatible endpoint.")
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    presigned_url_ttl_seconds: int = Field(default=900, ge=30, le=7 * 24 * 3600)

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
    webhook_allow_private_targets: bool = Field(
        default=False, description="Allow webhook URLs on loopback/private addresses (development, tests)."
    )

    @field_validator("allowed_file_roots", mode="before")
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

    @field_validator("storage_url")
    @classmethod
    def _storage_scheme(cls, value: str) -> str:
        if not (value.startswith("file:///") or value.startswith("s3://")):
            raise ValueError("storage_url must be file:///absolute/dir or s3://bucket/prefix")
        return value

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
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (and settings file); keyword arguments win."""
    return Settings(**overrides)
