"""infra/docker: the three images pass hadolint, are multi-stage with a non-root final stage on a pinned base and
without build tools, install what pyproject.toml pins for their role, and build from a context without secrets."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from infra_files import DOCKERFILES, ROOT, compose, load_module, render

BIN = Path(sys.executable).parent
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cuda-toolkit|nvcc)\b")
requirement = load_module(ROOT / "infra" / "docker" / "requirement.py", "infra_requirement")


def tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is installed by `pip install -e '.[worker,test]'` (pyproject.toml, test extra)"
    return path


def stages(dockerfile: Path) -> list[list[str]]:
    """Instructions per build stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            result.append([])
        result[-1].append(line)
    return result


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    result = subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_hadolint_does_report(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install gcc\n")
    result = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3006" in result.stdout


def test_the_trainer_node_script_passes_shellcheck():
    script = ROOT / "infra" / "docker" / "trainer-node.sh"
    result = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_non_root_pinned_and_no_build_tools_in_the_final_stage(dockerfile):
    built = stages(dockerfile)
    assert len(built) >= 2, "build in one stage, run in another"
    python = re.search(r">=(\d+\.\d+)", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "requires-python"])[1]
    for stage in built:
        assert re.fullmatch(rf"FROM python:{re.escape(python)}\.\d+-slim-bookworm( AS \w+)?", stage[0]), stage[0]
    final = built[-1]
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the final stage must run as a non-root user"
    assert not BUILD_TOOLS.search(" ".join(final)), "a compiler in the final stage"
    assert any(line.startswith("COPY --from=build /opt/draftsmith") for line in final)


def test_the_api_image_installs_no_worker_dependencies_and_the_workers_do():
    api = " ".join(" ".join(stage) for stage in stages(ROOT / "infra" / "docker" / "api.Dockerfile"))
    assert "requirement.py --extra |" in api and "--extra worker" not in api
    assert not re.search(r"COPY (trainer|kernels|worker) ", api)
    for name in ("worker-cpu.Dockerfile", "worker-gpu.Dockerfile"):
        worker = " ".join(" ".join(stage) for stage in stages(ROOT / "infra" / "docker" / name))
        assert "requirement.py --extra worker |" in worker and "requirement.py torch |" in worker
    cpu = (ROOT / "infra" / "docker" / "worker-cpu.Dockerfile").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu


def test_requirement_helper_prints_pyproject_pins(monkeypatch, capsys):
    monkeypatch.setattr(requirement, "PYPROJECT", ROOT / "pyproject.toml")
    assert requirement.main(["torch", "deepspeed"]) == 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out.split() == [line for line in pyproject["optional-dependencies"]["worker"]
                                               if line.split("==")[0] in ("torch", "deepspeed")]
    assert requirement.main(["--extra"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == pyproject["dependencies"]
    assert requirement.main(["no-such-package"]) == 1


def test_compose_and_kubernetes_use_the_three_images():
    services = compose()["services"]
    built = {service["build"]["dockerfile"] for service in services.values() if "build" in service}
    assert built == {str(path.relative_to(ROOT)) for path in DOCKERFILES}
    for overlay in ("gpu", "multinode"):
        images = {c["image"].split("/")[-1].split(":")[0] for doc in render(overlay) if doc["kind"] in (
            "Deployment", "StatefulSet", "Job") for c in doc["spec"]["template"]["spec"]["containers"]}
        assert images == {f"draftsmith-{path.name.removesuffix('.Dockerfile')}" for path in DOCKERFILES}


def test_the_build_context_leaves_out_secrets_and_local_state():
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: everything is out unless named"
    included = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert not included & {".env", ".venv", ".draftsmith", "out", "tests", ".git"}
    for dockerfile in DOCKERFILES:
        for stage in stages(dockerfile):
            for line in stage:
                if line.startswith("COPY ") and "--from=" not in line:
                    sources = [s for s in line.split()[1:-1] if not s.startswith("--")]
                    for source in sources:
                        assert source.rstrip("/") in included or source.rsplit("/", 1)[0] in included, (
                            f"{dockerfile.name}: {source} is not in the build context")
