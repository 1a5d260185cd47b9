"""Reading the deployment files the way their engines do, without the engines: compose's variable interpolation,
`kubectl kustomize` for the overlays, env files, and the settings a container ends up with."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "infra" / "k8s"
OVERLAYS = ("cpu", "gpu", "multinode")
SECRETS_EXAMPLE = K8S / "secrets.env.example"
DOCKERFILES = sorted((ROOT / "infra" / "docker").glob("*.Dockerfile"))
KUBERNETES_VERSION = "1.32.0"  # the oldest minor the manifests are validated against


def load_module(path: Path, name: str):
    """A script of infra/ as a module (infra/ is not a package: it is not installed)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


env_example = load_module(ROOT / "infra" / "env_example.py", "infra_env_example")


class InterpolationError(ValueError):
    """What `docker compose` reports (and refuses to start on) for a required variable that is missing."""


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation over a loaded document: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error},
    ${VAR?error}; `$$` is a literal `$`."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match) -> str:
        name, op, arg = match["name"], match["op"] or "", match["arg"] or ""
        present, set_nonempty = name in env, bool(env.get(name))
        if op in (":?", "?") and not (set_nonempty if op == ":?" else present):
            raise InterpolationError(f"required variable {name} is missing a value: {arg}")
        if op == ":-":
            return env[name] if set_nonempty else arg
        if op == "-":
            return env[name] if present else arg
        return env.get(name, "")

    parts = value.split("$$")
    return "$".join(env_example.INTERPOLATION.sub(substitute, part) for part in parts)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines; comments and blank lines skipped (the format of .env and `kubectl --from-env-file`)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def example_env() -> dict[str, str]:
    """.env.example as a user fills it in: every REQUIRED variable given a value."""
    values = read_env_file(ENV_EXAMPLE)
    filled = {name: value or f"{name.lower()}-0123456789-abcdefghijklmnopqrstuvwxyz" for name, value in values.items()}
    filled["FLOWER_BASIC_AUTH"] = "admin:flower-password"
    return filled


def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose(env: dict[str, str] | None = None) -> dict:
    """The compose model after interpolation (anchors resolved by YAML), as `docker compose config` builds it."""
    return interpolate(raw_compose(), example_env() if env is None else env)


def container_environment(service: dict) -> dict[str, str]:
    """What a container's environment holds: keys without a value are passed only when set, and here they are not."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    return {key: str(value) for key, value in environment.items() if value is not None}


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Exactly these DRAFTSMITH_* variables in os.environ while Settings reads them."""
    saved = dict(os.environ)
    for key in [key for key in os.environ if key.startswith("DRAFTSMITH_")]:
        del os.environ[key]
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def settings_from(values: dict[str, str]):
    from domain.settings import Settings

    with environ(values):
        return Settings()


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is needed to render infra/k8s (`kubectl kustomize`, offline); install Debian's kubectl"
    return path


@functools.cache
def render(overlay: str) -> tuple[dict, ...]:
    result = subprocess.run([kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {overlay}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(docs, kind: str, name: str | None = None) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)]


def one(docs, kind: str, name: str) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


def workloads(docs) -> list[dict]:
    return [doc for doc in docs if doc["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict) -> dict:
    return pod_spec(workload)["containers"][0]


def config_map_data(docs, name: str) -> dict[str, str]:
    return one(docs, "ConfigMap", name).get("data", {})


def pod_environment(docs, workload: dict, secrets: dict[str, str]) -> dict[str, str]:
    """The variables the pod's container starts with: envFrom ConfigMaps, then env (values, ConfigMap and
    Secret references resolved against `secrets`, the deployer's Secret). A missing required key is an error,
    as it is for the kubelet."""
    spec = container(workload)
    values: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        assert "configMapRef" in source, f"{workload['metadata']['name']}: only ConfigMaps come in through envFrom"
        values.update(config_map_data(docs, source["configMapRef"]["name"]))
    for entry in spec.get("env", []):
        if "value" in entry:
            values[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"].get("secretKeyRef") or entry["valueFrom"]["configMapKeyRef"]
        source = secrets if "secretKeyRef" in entry["valueFrom"] else config_map_data(docs, ref["name"])
        if ref["key"] in source:
            values[entry["name"]] = source[ref["key"]]
        else:
            assert ref.get("optional"), f"{workload['metadata']['name']}: {ref['key']} is required and missing"
    return values


def consumed_kinds(args: list[str]) -> set[str]:
    """The queue kinds a `draftsmith worker --queues a,b` command consumes."""
    assert args[:2] == ["draftsmith", "worker"], args
    queues = args[args.index("--queues") + 1] if "--queues" in args else "gpu,cpu"
    return {kind.strip() for kind in queues.split(",")}
