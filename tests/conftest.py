"""Shared fixtures: tiny random targets (milliseconds) and the real SmolLM2-135M (materialised once)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Validation measures a drafter in every serving engine installed here (trainer/validation/engines.py). Outside
# tests/engines/, which point this back at the real folder, a job's validate stage finds none, so the suite takes
# the same time on a machine with engines (bench/setup/) as on CI, which has none.
from trainer.validation.engine_paths import ENGINES_DIR_ENV

os.environ.setdefault("DRAFTSMITH_TEST_REAL_ENGINES_DIR", os.environ.get(ENGINES_DIR_ENV, ""))
os.environ[ENGINES_DIR_ENV] = str(Path(__file__).parent / "no-engines-outside-tests-engines")

# `make test` runs the suite on several workers (pytest-xdist): each gets its share of the cores for torch's threads,
# the processes it starts included (trainer subprocesses, torchrun ranks), so workers do not fight over the cores.
# Set before torch is imported (engine_paths above does not import it); an OMP_NUM_THREADS already set wins.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _XDIST_WORKERS)))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from trainer.targets.bundled import prepare_bundled

    # The default cache (~/.cache/draftsmith) survives between CI runs on one machine; a fresh machine
    # materialises it once (~25 s).
    return prepare_bundled("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from trainer.targets import load_target

    return load_target(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    from tiny_targets import make_tiny_target

    from trainer.targets import load_target

    return load_target(make_tiny_target(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3"))


@pytest.fixture
def reference_dflash():
    """The reference package, with its CUDA timer replaced so return_stats works on a CPU."""
    import dflash.model

    original = dflash.model._cuda_time
    dflash.model._cuda_time = time.perf_counter
    yield dflash.model
    dflash.model._cuda_time = original


# This machine has no DNS. Names under example.com and .example stand for customers' public servers in the
# tests, so the egress policy (domain/egress.py) resolves them to a public address (example.com's own); every
# other name goes to the system resolver (/etc/hosts). Tests of rebinding install their own resolver on top.
EXAMPLE_PUBLIC_ADDRESS = "93.184.216.34"


@pytest.fixture(autouse=True)
def _example_names_resolve_publicly(monkeypatch):
    import domain.egress as egress

    def resolve(host: str, port: int) -> list[str]:
        if host == "example.com" or host.endswith((".example.com", ".example")):
            return [EXAMPLE_PUBLIC_ADDRESS]
        return egress.system_resolver(host, port)

    monkeypatch.setattr(egress, "resolver", resolve)
