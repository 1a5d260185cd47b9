"""docker-compose.yml: valid Compose, healthy in order, refusing to start without its secrets, and wiring every
Draftsmith container to the stack's own PostgreSQL, Redis and MinIO with settings the application accepts."""

from __future__ import annotations

import copy
import json
from importlib import resources
from urllib.parse import urlsplit

import jsonschema
import pytest
from infra_files import (
    ROOT,
    InterpolationError,
    compose,
    container_environment,
    example_env,
    interpolate,
    raw_compose,
    read_env_file,
    settings_from,
)

DRAFTSMITH_SERVICES = ("migrate", "api", "worker-cpu", "worker-gpu")


def compose_schema() -> dict:
    # The Compose specification's schema as vendored, pinned, by check-jsonschema (nothing fetched at test time).
    text = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    return json.loads(text)


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(compose_schema())
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def test_the_compose_file_follows_the_compose_specification():
    assert schema_errors(raw_compose()) == []
    assert schema_errors(compose()) == []


def test_the_specification_check_catches_a_misspelt_key():
    broken = copy.deepcopy(raw_compose())
    broken["services"]["api"]["healthchek"] = broken["services"]["api"].pop("healthcheck")
    assert any("healthchek" in error for error in schema_errors(broken))


def one_shots(services: dict) -> set[str]:
    return {name for name, service in services.items() if service.get("restart") == "no"}


def test_every_long_running_service_has_a_health_check_and_one_shots_gate_their_dependents():
    services = compose()["services"]
    for name, service in services.items():
        if name in one_shots(services):
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"
    # Starting order follows health: a dependency is either healthy or, for one-shots, completed successfully.
    gated = set()
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            expected = ("service_completed_successfully" if dependency in one_shots(services)
                        else "service_healthy")
            assert rule["condition"] == expected, f"{name} -> {dependency}: {rule['condition']}"
            gated.add(dependency)
    assert one_shots(services) == {"migrate", "minio-init"}
    assert one_shots(services) <= gated, "a one-shot nobody waits for"
    for name in ("api", "worker-cpu", "worker-gpu"):
        assert set(services[name]["depends_on"]) >= {"migrate", "minio-init", "redis"}
    assert services["migrate"]["command"] == ["draftsmith", "db", "upgrade"]


def test_state_lives_in_named_volumes():
    model = compose()
    for name, service in model["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            assert source in model["volumes"], f"{name} mounts {source}, not a named volume"
    stateful = {"postgres", "redis", "minio", "worker-cpu", "worker-gpu"}
    assert stateful <= {name for name, service in model["services"].items() if service.get("volumes")}


def required_variables() -> list[str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return [lines[i + 1].split("=")[0] for i, line in enumerate(lines[:-1]) if line == "# REQUIRED"]


def test_compose_refuses_to_start_without_each_required_secret():
    required = required_variables()
    assert {"DRAFTSMITH_SECRET_KEY", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD",
            "DRAFTSMITH_S3_SECRET_ACCESS_KEY", "FLOWER_BASIC_AUTH"} <= set(required)
    # .env.example as shipped, copied to .env unedited: refused.
    with pytest.raises(InterpolationError):
        interpolate(raw_compose(), read_env_file(ROOT / ".env.example"))
    for name in required:
        for missing in ({k: v for k, v in example_env().items() if k != name}, {**example_env(), name: ""}):
            with pytest.raises(InterpolationError, match=name):
                interpolate(raw_compose(), missing)


def test_every_draftsmith_container_gets_settings_the_application_accepts():
    env = example_env()
    services = compose(env)["services"]
    postgres = services["postgres"]["environment"]
    for name in DRAFTSMITH_SERVICES:
        settings = settings_from(container_environment(services[name]))
        assert settings.env == "production" and not settings.development
        assert settings.secret_key.get_secret_value() == env["DRAFTSMITH_SECRET_KEY"]
        database = urlsplit(settings.database_url)
        assert (database.hostname, database.username, database.password, database.path) == (
            "postgres", postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], f"/{postgres['POSTGRES_DB']}")
        broker = urlsplit(settings.broker_url)
        assert broker.scheme == "redis" and broker.hostname in services
        assert settings.broker_url == services["flower"]["environment"]["CELERY_BROKER_URL"]
        # Storage: the bucket minio-init creates, on MinIO by a name it answers to, with the user minio-init makes.
        storage = urlsplit(settings.storage_url)
        init = services["minio-init"]["environment"]
        assert storage.scheme == "s3" and storage.hostname == init["S3_BUCKET"]
        endpoint = urlsplit(settings.s3_endpoint_url)
        assert endpoint.hostname in services["minio"]["networks"]["default"]["aliases"]
        assert f"127.0.0.1:{env.get('MINIO_PORT', '9000')}:{endpoint.port}" in services["minio"]["ports"]
        assert settings.s3_access_key_id == init["S3_ACCESS_KEY_ID"]
        assert settings.s3_secret_access_key.get_secret_value() == init["S3_SECRET_ACCESS_KEY"]


def test_an_optional_setting_in_env_reaches_the_containers_and_an_unset_one_keeps_its_default():
    env = {**example_env(), "DRAFTSMITH_WORKER_NPROC": "4"}
    services = compose(env)["services"]
    # compose passes a value-less key from its environment (.env) when set there: as the interpolation does here.
    worker = container_environment(services["worker-gpu"])
    passed = {key: env[key] for key, value in services["worker-gpu"]["environment"].items()
              if value is None and key in env}
    settings = settings_from({**worker, **passed})
    assert settings.worker_nproc == 4
    assert settings.webhook_max_attempts == type(settings).model_fields["webhook_max_attempts"].default


def test_gpu_worker_is_optional_and_on_the_nvidia_runtime():
    services = compose()["services"]
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["command"][:4] == ["draftsmith", "worker", "--queues", "gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert all("profiles" not in service for name, service in services.items() if name != "worker-gpu")
    # Without the gpu profile the CPU worker takes every stage, so the default stack completes jobs.
    assert services["worker-cpu"]["command"] == ["draftsmith", "worker", "--queues", "gpu,cpu"]
    with_gpu = compose({**example_env(), "WORKER_CPU_QUEUES": "cpu"})["services"]
    assert with_gpu["worker-cpu"]["command"][-1] == "cpu"
