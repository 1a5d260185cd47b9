"""Functions a reader can hold (house plan S8, issue 34): no product function over `LIMIT` lines, as a ratchet.

A function's length is its lines from `def` to its last line (`end_lineno - lineno + 1`; decorators excluded,
its docstring, comments and blank lines included). A nested function counts twice: within its parent, whose
span holds it, and on its own, named like Python's `__qualname__` (`outer.<locals>.inner`). Product code is
every .py file under the product packages; tests/ and bench/ are not measured.

`KNOWN_LONG` lists today's longer functions with their length, and may only shrink: a new function over the
limit fails, a known one that grew fails, and a known one now at or under the limit (or gone) fails until its
entry is deleted here. Shorten a long function freely; lower its number here when you do.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LIMIT = 80

PRODUCT_PACKAGES = ("schemas", "kernels", "trainer", "domain", "api", "worker", "migrations", "draftsmith", "report")

KNOWN_LONG: dict[str, int] = {
    "migrations/versions/0001_initial_schema.py::upgrade": 195,  # a migration's DDL, never edited once shipped
    "migrations/versions/0003_fine_tune_pipelines.py::upgrade": 82,  # likewise
    "trainer/export/gguf_tokenizer.py::_special_vocabulary": 109,
    "trainer/validation/engines.py::run_engines": 100,
    "trainer/export/model_card.py::model_card": 90,
    "api/estimates.py::estimate_job": 84,
}
"""`path::qualname` -> lines, for the functions over `LIMIT` today."""


def function_lengths(path: Path) -> dict[str, int]:
    """`qualname` -> lines for every function and method in one file, nested ones included."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:  # if/try/with blocks at module or class level: their functions keep the enclosing prefix
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return lengths


def product_function_lengths() -> dict[str, int]:
    return {f"{path.relative_to(ROOT).as_posix()}::{name}": lines
            for package in PRODUCT_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            for name, lines in function_lengths(path).items()}


def test_no_function_over_80_lines():
    lengths = product_function_lengths()
    problems = []
    for name, lines in sorted(lengths.items()):
        if lines <= LIMIT:
            continue
        if name not in KNOWN_LONG:
            problems.append(f"{name} is {lines} lines (the limit is {LIMIT}): split it")
        elif lines > KNOWN_LONG[name]:
            problems.append(f"{name} grew from {KNOWN_LONG[name]} to {lines} lines: KNOWN_LONG may only shrink")
    for name, known in sorted(KNOWN_LONG.items()):
        if name not in lengths:
            problems.append(f"{name} is gone: delete its KNOWN_LONG entry")
        elif lengths[name] <= LIMIT:
            problems.append(f"{name} is {lengths[name]} lines now (was {known}): delete its KNOWN_LONG entry")
    assert not problems, "\n".join(problems)


def test_lengths_count_from_def_to_the_last_line_nested_functions_twice(tmp_path):
    source = '''
import functools

class Outer:
    @functools.cache
    def method(self):
        def inner():
            return 1

        return inner()


if True:
    async def late():
        pass
'''
    path = tmp_path / "sample.py"
    path.write_text(source)
    assert function_lengths(path) == {"Outer.method": 5, "Outer.method.<locals>.inner": 2, "late": 2}
