"""One list of settings, the application's: every DRAFTSMITH_* name a deployment file sets is one the application
reads (a misspelt name would be ignored in silence), every setting is documented for compose, and every
deployment provides the settings without which its processes would not share one state."""

from __future__ import annotations

import ast
import re
from urllib.parse import urlsplit

import pytest
from infra_files import (
    COMPOSE_FILE,
    DOCKERFILES,
    ENV_EXAMPLE,
    OVERLAYS,
    ROOT,
    SECRETS_EXAMPLE,
    env_example,
    find,
    pod_environment,
    read_env_file,
    render,
    settings_from,
    workloads,
)

from domain.settings import SETTINGS_FILE_ENV, Settings

NAME = re.compile(r"\bDRAFTSMITH_[A-Z0-9_]+\b")
# Set by `draftsmith worker` itself from --queues (worker/cli.py) before the worker reads it: a value from a
# deployment would be overwritten, so naming it there is a mistake.
INTERNAL = {"DRAFTSMITH_WORKER_QUEUES"}
# Without these, each process falls back to an embedded default of its own (a SQLite file, a folder of broker
# messages, a local directory), so the API and the workers would not share jobs, queue or files.
SHARED_STATE = ("database_url", "broker_url", "storage_url")


def settings_names() -> set[str]:
    return {env_name(field) for field in Settings.model_fields}


def env_name(field: str) -> str:
    return env_example.env_name(field)


def environment_reads(package: str) -> set[str]:
    """DRAFTSMITH_* names the code reads straight from the environment (os.environ.get / os.getenv / [...])."""
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                function = ast.unparse(node.func)
                if function.endswith(("environ.get", "getenv")) and NAME.fullmatch(str(node.args[0].value)):
                    names.add(node.args[0].value)
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
                if isinstance(node.slice, ast.Constant) and NAME.fullmatch(str(node.slice.value)):
                    names.add(node.slice.value)
    return names


def application_names() -> set[str]:
    """What the server processes read: the settings object, its settings file, and the few direct reads."""
    direct = set().union(*(environment_reads(package) for package in ("api", "worker", "trainer")))
    return settings_names() | {SETTINGS_FILE_ENV} | direct


def manifest_names(docs) -> set[str]:
    names = set()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            names |= {key for key in doc.get("data", {}) if key.startswith("DRAFTSMITH_")}
    for workload in workloads(docs):
        for entry in workload["spec"]["template"]["spec"]["containers"][0].get("env", []):
            names.add(entry["name"])
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["key"])
    return {name for name in names if name.startswith("DRAFTSMITH_")}


def deployment_files() -> dict[str, set[str]]:
    files = {str(path.relative_to(ROOT)): set(NAME.findall(path.read_text()))
             for path in (COMPOSE_FILE, ENV_EXAMPLE, SECRETS_EXAMPLE, *DOCKERFILES,
                          ROOT / "infra" / "docker" / "trainer-node.sh")}
    # env file lines (KEY=value) of the manifests' sources, and what the manifests render to
    for path in (ROOT / "infra" / "k8s").rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".env", ""):
            files[str(path.relative_to(ROOT))] = set(NAME.findall(path.read_text()))
    for overlay in OVERLAYS:
        files[f"kubectl kustomize overlays/{overlay}"] = manifest_names(render(overlay))
    return files


def unknown_names(files: dict[str, set[str]]) -> dict[str, list[str]]:
    known = application_names() - INTERNAL
    return {file: sorted(names - known) for file, names in files.items() if names - known}


def test_the_direct_environment_reads_are_found():
    # The scan that feeds the allowed names must see what the code reads; these two are read outside Settings.
    assert {"DRAFTSMITH_CACHE", "DRAFTSMITH_WORKER_QUEUES"} <= application_names()


def test_every_setting_named_in_a_deployment_file_is_one_the_application_reads():
    files = deployment_files()
    assert unknown_names(files) == {}
    # Each deployment way names settings at all (the scan is not reading empty files).
    assert files["docker-compose.yml"] and files[".env.example"]
    assert all(files[f"kubectl kustomize overlays/{overlay}"] for overlay in OVERLAYS)


def test_a_misspelt_setting_is_reported():
    files = {"docker-compose.yml": {"DRAFTSMITH_DATABASE_URL", "DRAFTSMITH_DATABSE_URL"},
             "infra/k8s/x.yaml": {"DRAFTSMITH_WORKER_QUEUES"}}
    assert unknown_names(files) == {"docker-compose.yml": ["DRAFTSMITH_DATABSE_URL"],
                                    "infra/k8s/x.yaml": ["DRAFTSMITH_WORKER_QUEUES"]}


def test_env_example_is_generated_from_the_settings_and_the_compose_file():
    assert ENV_EXAMPLE.read_text() == env_example.render(), (
        ".env.example is stale: python infra/env_example.py > .env.example")


def test_every_setting_is_documented_in_env_example_and_given_to_compose_or_excluded_with_a_reason():
    documented = ENV_EXAMPLE.read_text()
    passed = set(env_example.compose_environment(COMPOSE_FILE.read_text()))
    for field in Settings.model_fields:
        name = env_name(field)
        assert name in documented, f"{name} is missing from .env.example"
        assert (name in passed) != (field in env_example.NOT_IN_COMPOSE), (
            f"{name}: pass it in docker-compose.yml's {env_example.ENVIRONMENT_ANCHOR} or say why not in "
            "infra/env_example.py NOT_IN_COMPOSE")


def test_the_secret_key_is_required_outside_development():
    with pytest.raises(ValueError, match="DRAFTSMITH_SECRET_KEY"):
        settings_from({})


def secrets_example() -> dict[str, str]:
    return read_env_file(SECRETS_EXAMPLE) | {"DRAFTSMITH_SECRET_KEY": "s" * 48}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_kubernetes_pod_gets_the_required_settings_from_the_secret_and_they_validate(overlay):
    docs = render(overlay)
    secret_fields = {field for field, info in Settings.model_fields.items()
                     if "SecretStr" in str(info.annotation)} | set(SHARED_STATE) - {"storage_url"}
    for workload in workloads(docs):
        name = workload["metadata"]["name"]
        env = {entry["name"]: entry for entry in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
        for field in ("secret_key", "database_url", "broker_url"):
            ref = env[env_name(field)]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "draftsmith-secrets" and not ref.get("optional"), f"{name}: {field}"
        settings = settings_from(pod_environment(docs, workload, secrets_example()))
        for field in SHARED_STATE:
            assert getattr(settings, field) != Settings.model_fields[field].get_default(call_default_factory=True), (
                f"{name}: {field} left at its embedded default")
        assert urlsplit(settings.storage_url).scheme == "s3"
        assert urlsplit(settings.database_url).scheme.startswith("postgres")
        assert urlsplit(settings.broker_url).scheme == "redis"
    # Secrets are referenced, never written into a manifest.
    assert find(docs, "Secret") == []
    for config_map in find(docs, "ConfigMap"):
        assert not {env_name(field) for field in secret_fields} & set(config_map.get("data", {}))


def test_the_secret_example_names_every_key_the_manifests_reference():
    referenced = set()
    for overlay in OVERLAYS:
        for workload in workloads(render(overlay)):
            for entry in workload["spec"]["template"]["spec"]["containers"][0]["env"]:
                ref = entry["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "draftsmith-secrets"
                referenced.add(ref["key"])
    text = SECRETS_EXAMPLE.read_text()
    keys = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, re.MULTILINE))
    assert referenced <= keys
    assert {"KEDA_REDIS_ADDRESS", "KEDA_REDIS_PASSWORD"} <= set(read_env_file(SECRETS_EXAMPLE))


def test_kedas_view_of_redis_is_the_broker_of_the_settings():
    secrets = read_env_file(SECRETS_EXAMPLE)
    broker = urlsplit(secrets["DRAFTSMITH_BROKER_URL"])
    assert secrets["KEDA_REDIS_ADDRESS"] == f"{broker.hostname}:{broker.port}"
    assert secrets["KEDA_REDIS_PASSWORD"] == (broker.password or "")
    for overlay in OVERLAYS:
        for scaled in find(render(overlay), "ScaledObject"):
            for trigger in scaled["spec"]["triggers"]:
                assert trigger["metadata"]["databaseIndex"] == broker.path.lstrip("/"), scaled["metadata"]["name"]

