"""The import rules of docs/ARCHITECTURE.md: api -> schemas; worker -> trainer -> kernels."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "kernels": {"trainer", "api", "worker", "fastapi", "celery", "sqlalchemy", "alembic"},
    "trainer": {"api", "worker", "fastapi", "celery", "sqlalchemy", "alembic"},
    "schemas": {"torch", "transformers", "trainer", "kernels", "api", "worker", "fastapi", "celery", "sqlalchemy"},
    "api": {"torch", "transformers", "deepspeed", "trainer", "kernels", "worker"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
        if imported_roots(path) & FORBIDDEN[package]
    }
    assert not offenders, f"{package}/ imports what it must not: {offenders}"
