"""The import rules of docs/ARCHITECTURE.md, as a ratchet towards ../shared/HOUSE_PLAN.md's end state.

`PLAN` is where each product package may import from inside the repository once the house plan is done.
`KNOWN` lists today's exceptions, one (file, module) pair each. A new wrong-way import fails
`test_imports_follow_the_plan`; a fixed one fails `test_known_exceptions_still_exist` until its line is
deleted here, so the list can only shrink. `FORBIDDEN` holds the absolute rules on third-party libraries.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLAN: dict[str, set[str]] = {
    "schemas": set(),
    "kernels": set(),
    "trainer": {"schemas", "kernels"},
    "control": {"schemas"},
    "api": {"control", "schemas"},
    "worker": {"control", "schemas", "trainer"},
    "migrations": {"control"},
    "draftsmith": {"schemas", "trainer"},
    "report": {"schemas"},
}
"""The end state: the in-repo packages each product package may import (the house plan's table)."""

PACKAGES = set(PLAN)

FORBIDDEN: dict[str, set[str]] = {
    "kernels": {"trainer", "api", "worker", "fastapi", "celery", "sqlalchemy", "alembic"},
    "trainer": {"api", "worker", "fastapi", "celery", "sqlalchemy", "alembic"},
    "schemas": {"torch", "transformers", "trainer", "kernels", "api", "worker", "fastapi", "celery", "sqlalchemy"},
    "api": {"torch", "transformers", "deepspeed", "trainer", "kernels", "worker"},
}
"""Absolute rules, no exceptions: what a package never imports (in-repo or third-party)."""

KNOWN: set[tuple[str, str]] = {
    # trainer reads the version and the chart assets from draftsmith (house plan S6)
    ("trainer/lineage.py", "draftsmith"),
    # the API reads its version from draftsmith; api/db runs Alembic (S3)
    ("api/db.py", "migrations"),
    ("api/main.py", "draftsmith"),
    # the worker reaches the domain core, still in api/ (S1, S4)
    ("worker/app.py", "api"),
    ("worker/app.py", "api.audits"),
    ("worker/app.py", "api.db"),
    ("worker/app.py", "api.queue"),
    ("worker/app.py", "api.redaction"),
    ("worker/app.py", "api.settings"),
    ("worker/audits.py", "api.audits"),
    ("worker/audits.py", "api.models"),
    ("worker/cli.py", "api.cli"),
    ("worker/cli.py", "api.db"),
    ("worker/context.py", "api.db"),
    ("worker/context.py", "api.queue"),
    ("worker/context.py", "api.settings"),
    ("worker/context.py", "api.storage"),
    ("worker/drafters.py", "api"),
    ("worker/drafters.py", "api.models"),
    ("worker/drafters.py", "api.settings"),
    ("worker/health.py", "api.queue"),
    ("worker/health.py", "api.settings"),
    ("worker/publish.py", "api"),
    ("worker/publish.py", "api.models"),
    ("worker/reporting.py", "api"),
    ("worker/runner.py", "api"),
    ("worker/runner.py", "api.models"),
    ("worker/runner.py", "api.problems"),
    ("worker/runner.py", "api.queue"),
    ("worker/runner.py", "api.states"),
    ("worker/shards.py", "api"),
    ("worker/shards.py", "api.jobs"),
    ("worker/shards.py", "api.models"),
    ("worker/shards.py", "api.states"),
    ("worker/sources.py", "api.redaction"),
    ("worker/sources.py", "api.secrets"),
    ("worker/sources.py", "api.settings"),
    ("worker/sources.py", "api.storage"),
    ("worker/sources.py", "api.storage_scope"),
    ("worker/stages.py", "api"),
    ("worker/stages.py", "api.jobs"),
    ("worker/stages.py", "api.models"),
    ("worker/stages.py", "api.settings"),
    ("worker/sync.py", "api.storage"),
    ("worker/usage.py", "api"),
    ("worker/usage.py", "api.jobs"),
    ("worker/usage.py", "api.models"),
    # Alembic's environment reads the models and the database URL rules from api/ (S4)
    ("migrations/env.py", "api.db"),
    ("migrations/env.py", "api.models"),
    ("migrations/env.py", "api.settings"),
}

CORE = {
    "models", "db", "settings", "redaction", "outbound", "events", "shards", "storage", "queue",
    "drafters", "usage", "secrets", "webhooks", "storage_scope", "states", "jobs", "audits", "stage_runner",
}
"""The domain and database core still inside api/ (it moves out in house plan S4): what the worker runs on.
Until then it may import only itself from api/, never the HTTP layer (problems, schemas, routes)."""

KNOWN_CORE: set[tuple[str, str]] = {
    # core modules raising HTTP errors (S1) and returning response models (S2)
    ("api/drafters.py", "api.problems"),
    ("api/usage.py", "api.problems"),
    ("api/secrets.py", "api.problems"),
    ("api/storage_scope.py", "api.problems"),
    ("api/states.py", "api.problems"),
    ("api/jobs.py", "api.problems"),
    ("api/jobs.py", "api.schemas"),
    ("api/audits.py", "api.problems"),
    ("api/stage_runner.py", "api.problems"),
}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports, function-local imports included (`from a import b` gives `a`)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def imported_roots(path: Path) -> set[str]:
    return {module.split(".")[0] for module in imported_modules(path)}


def product_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def plan_violations() -> set[tuple[str, str]]:
    found = set()
    for package, allowed in PLAN.items():
        for path in product_files(package):
            for module in imported_modules(path):
                root = module.split(".")[0]
                if root in PACKAGES and root != package and root not in allowed:
                    found.add((str(path.relative_to(ROOT)), module))
    return found


def core_violations() -> set[tuple[str, str]]:
    found = set()
    for name in CORE:
        path = ROOT / "api" / f"{name}.py"
        if not path.exists():
            continue
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "api" and (len(parts) == 1 or parts[1] not in CORE):
                found.add((str(path.relative_to(ROOT)), module))
    return found


def test_imports_follow_the_plan():
    new = plan_violations() - KNOWN
    assert not new, f"imports against the plan in tests/test_layout.py (PLAN): {sorted(new)}"


def test_known_exceptions_still_exist():
    fixed = KNOWN - plan_violations()
    assert not fixed, f"these are fixed: delete them from KNOWN in tests/test_layout.py: {sorted(fixed)}"


def test_core_does_not_import_the_http_layer():
    new = core_violations() - KNOWN_CORE
    assert not new, f"api/'s domain core imports the HTTP layer: {sorted(new)}"
    fixed = KNOWN_CORE - core_violations()
    assert not fixed, f"these are fixed: delete them from KNOWN_CORE in tests/test_layout.py: {sorted(fixed)}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in product_files(package)
        if imported_roots(path) & FORBIDDEN[package]
    }
    assert not offenders, f"{package}/ imports what it must not: {offenders}"


def render_plan_table() -> str:
    """The import-plan table of docs/ARCHITECTURE.md, rendered from PLAN (the doc must contain it verbatim)."""
    lines = ["| package | may import (in-repo, end state) |", "|---|---|"]
    for package, allowed in PLAN.items():
        lines.append(f"| `{package}/` | {', '.join(f'`{name}`' for name in sorted(allowed)) or '—'} |")
    return "\n".join(lines)


def test_architecture_table_matches_plan():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert render_plan_table() in doc, (
        "docs/ARCHITECTURE.md's import plan differs from PLAN in tests/test_layout.py; paste this table:\n"
        + render_plan_table()
    )
