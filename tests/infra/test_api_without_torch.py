"""The API image installs pyproject.toml's base dependencies only: the control plane (the app, its CLI commands,
migrations) must import and start with every package of the `worker` extra unavailable."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions

from infra_files import ROOT


def worker_only_modules() -> list[str]:
    """Top-level modules of the worker extra's distributions that the base set does not also bring."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(lines: list[str]) -> set[str]:
        return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", line)[0]).lower() for line in lines}

    worker, base = names(project["optional-dependencies"]["worker"]), names(project["dependencies"])
    modules = sorted(module for module, dists in packages_distributions().items()
                     if {d.lower().replace("_", "-") for d in dists} & (worker - base))
    assert {"torch", "transformers", "deepspeed", "numpy"} <= set(modules)
    return modules


def run_blocked(code: str, blocked: list[str]) -> subprocess.CompletedProcess:
    program = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = set({blocked!r})

        class RefuseWorkerPackages(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (not in the API image)")
                return None

        sys.meta_path.insert(0, RefuseWorkerPackages())
    """) + textwrap.dedent(code)
    env = {"PATH": "/usr/bin:/bin", "DRAFTSMITH_ENV": "development", "HOME": str(ROOT)}
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_control_plane_imports_and_serves_without_the_worker_packages(tmp_path):
    result = run_blocked(f"""
        from fastapi.testclient import TestClient
        from click.testing import CliRunner
        import api.main, api.cli, draftsmith.cli, draftsmith.submit
        from migrations.revisions import head_revision, upgrade
        from domain.settings import load_settings

        url = "sqlite:///{tmp_path}/api.db"
        upgrade(url)  # the migrations run too
        app = api.main.create_app(load_settings(database_url=url, broker_url="disabled"))
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/readyz").status_code == 200, client.get("/readyz").text
        for command in (["api", "--help"], ["db", "--help"], ["keys", "--help"], ["submit", "--help"]):
            outcome = CliRunner().invoke(draftsmith.cli.main, command)
            assert outcome.exit_code == 0, (command, outcome.output)
        assert not [name for name in sys.modules if name.split(".")[0] in BLOCKED]
        print("ok", head_revision())
    """, worker_only_modules())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok ")


def test_the_block_is_real():
    result = run_blocked("import kernels.selector", worker_only_modules())  # torch at its top
    assert result.returncode != 0 and "not in the API image" in result.stderr
