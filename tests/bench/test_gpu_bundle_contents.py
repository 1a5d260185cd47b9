"""Every third-party distribution the GPU check's code imports is either on the GPU image or in the offline bundle
(bench/gpu_bundle.py): the image has no network, so a missing one (accelerate, pyarrow) would only show there, minutes
into a run. Static: the imports are read with ast, mapped to distributions through this venv's metadata."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from bench import gpu_bundle  # noqa: E402

# What `draftsmith run` and bench/gpu_check.py load: the trainer and what it imports, the CLI, the check itself.
GPU_PATH = ["trainer", "kernels", "schemas", "report", "draftsmith/cli.py", "draftsmith/pipeline_cli.py",
            "bench/gpu_check.py"]
LOCAL = {"trainer", "kernels", "schemas", "report", "draftsmith", "bench", "domain", "api", "worker", "migrations"}
# Imported only where a user chooses them, each behind its own error message: serving-engine backends and peers.
# Needed though no module of ours imports it: transformers loads a GGUF (the bundled target) only with accelerate.
RUNTIME_ONLY = {"accelerate": "transformers' GGUF loading (trainer/targets/bundled.py)"}
OPTIONAL = {"vllm", "sglang", "dflash", "llama_cpp", "specforge", "speculators", "boto3", "botocore", "datasets"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_levels(paths) -> dict[str, set[str]]:
    """{top-level module: {files importing it}} for absolute imports in `paths`."""
    found: dict[str, set[str]] = {}
    files = []
    for entry in paths:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(file.relative_to(ROOT)))
    return found


def bundled_distributions() -> set[str]:
    names = {re.split(r"[=<>!~\[ ]", requirement)[0] for requirement in gpu_bundle.REQUIREMENTS}
    names |= {gpu_bundle.DEEPSPEED.split("==")[0], gpu_bundle.TARGET_WHEEL.split("==")[0], "draftsmith"}
    return {_normal(name) for name in names}


def requirements_closure(distributions: set[str]) -> set[str]:
    """The distributions plus what they require on the image's Python 3.12 / Linux (no extras), from this venv's
    installed metadata: what pip's resolution in `gpu_bundle.build` adds to the bundle."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(distributions)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(
                    {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
                     "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}):
                continue
            todo.append(_normal(requirement.name))
    return seen


def uncovered(bundle: set[str]) -> list[str]:
    module_to_dists = importlib.metadata.packages_distributions()
    covered = set(gpu_bundle.IMAGE_DISTRIBUTIONS) | requirements_closure(bundle)
    needed: dict[str, set[str]] = {name: {why} for name, why in RUNTIME_ONLY.items()}
    problems = []
    for module, files in sorted(imported_top_levels(GPU_PATH).items()):
        if module in sys.stdlib_module_names or module in LOCAL or module in OPTIONAL or module == "__future__":
            continue
        dists = module_to_dists.get(module)
        if not dists:
            problems.append(f"module {module!r} (imported by {sorted(files)[0]}) maps to no installed distribution")
            continue
        for dist in dists:
            needed.setdefault(_normal(dist), set()).update(files)
    for dist in sorted(needed):
        if dist not in covered:
            where = sorted(needed[dist])[0]
            problems.append(f"{dist} (needed by {where}) is neither on the GPU image nor in the bundle")
    return problems


def test_every_distribution_the_gpu_path_imports_is_on_the_image_or_in_the_bundle():
    assert uncovered(bundled_distributions()) == []


def test_a_bundle_without_accelerate_or_pyarrow_is_caught():
    bundle = bundled_distributions()
    # peft requires accelerate, so the bundle's resolution would still pull it in: drop both to plant the gap
    for dropped, name in (({"accelerate", "peft"}, "accelerate"), ({"pyarrow"}, "pyarrow"), ({"scipy"}, "scipy")):
        problems = uncovered(bundle - dropped)
        assert any(problem.startswith(f"{name} ") for problem in problems), problems


def test_the_image_list_keeps_what_the_image_lacks_out():
    # docs/DEVICES.md: the image has no pydantic, deepspeed, scipy, gguf, accelerate, pyarrow or peft
    assert not gpu_bundle.IMAGE_DISTRIBUTIONS & {"pydantic", "deepspeed", "scipy", "gguf", "accelerate", "pyarrow", "peft"}
