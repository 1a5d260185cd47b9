"""The rules of docs/ARCHITECTURE.md ("The house rules", "The import plan"), as ratchets towards its end state.

`PLAN` is where each product package may import from inside the repository in the end state.
`KNOWN` lists today's exceptions, one (file, module) pair each. A new wrong-way import fails
`test_imports_follow_the_plan`; a fixed one fails `test_known_exceptions_still_exist` until its line is
deleted here, so the list can only shrink. `FORBIDDEN` holds the absolute rules on third-party libraries.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLAN: dict[str, set[str]] = {
    "schemas": set(),
    "kernels": set(),
    "trainer": {"schemas", "kernels", "report"},
    "domain": {"schemas"},
    "api": {"domain", "schemas", "migrations", "report"},
    "worker": {"domain", "schemas", "trainer", "migrations"},
    "migrations": {"domain"},
    "draftsmith": {"schemas", "trainer"},
    "report": {"schemas"},
}
"""The end state: the in-repo packages each product package may import (docs/ARCHITECTURE.md's table, with two
additions: the API's and the worker's edges ask `migrations.revisions` whether the schema is current before they
serve, and `draftsmith db` runs the migrations, while the domain core itself never imports `migrations`; and the
`report` leaf, the report's renderers and chart assets, is read by the trainer's export and the API's dashboard)."""

PACKAGES = set(PLAN)

FORBIDDEN: dict[str, set[str]] = {
    "kernels": {"trainer", "api", "worker", "fastapi", "celery", "sqlalchemy", "alembic"},
    "trainer": {"api", "worker", "draftsmith", "fastapi", "celery", "sqlalchemy", "alembic"},
    "schemas": {"torch", "transformers", "trainer", "kernels", "api", "worker", "fastapi", "celery", "sqlalchemy"},
    "api": {"torch", "transformers", "deepspeed", "trainer", "kernels", "worker"},
    "domain": {"api", "worker", "trainer", "migrations", "draftsmith", "fastapi", "starlette", "uvicorn", "torch"},
    "worker": {"api", "fastapi", "starlette"},
    "migrations": {"api", "fastapi", "starlette", "worker", "trainer", "torch"},
    "report": {"torch", "api", "domain", "worker", "trainer", "fastapi"},
}
"""Absolute rules, no exceptions: what a package never imports (in-repo or third-party)."""

KNOWN: set[tuple[str, str]] = set()
"""Empty since house plan S6 (trainer/lineage.py and api/main.py read the version from the distribution's
metadata, the chart assets live in report/); kept so that a later step can hold the same ratchet."""


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


@functools.cache
def product_trees() -> list[tuple[str, ast.AST]]:
    """(path relative to the repository, syntax tree) of every product file."""
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for package in PLAN
            for path in product_files(package)]


def plan_violations() -> set[tuple[str, str]]:
    found = set()
    for package, allowed in PLAN.items():
        for path in product_files(package):
            for module in imported_modules(path):
                root = module.split(".")[0]
                if root in PACKAGES and root != package and root not in allowed:
                    found.add((str(path.relative_to(ROOT)), module))
    return found


def test_imports_follow_the_plan():
    new = plan_violations() - KNOWN
    assert not new, f"imports against the plan in tests/test_layout.py (PLAN): {sorted(new)}"


def test_known_exceptions_still_exist():
    fixed = KNOWN - plan_violations()
    assert not fixed, f"these are fixed: delete them from KNOWN in tests/test_layout.py: {sorted(fixed)}"


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


def test_no_private_name_is_imported_across_packages():
    """`from api.cli import _settings` in worker/ made a private helper a contract: say it in public or own it."""
    offenders = []
    for package in PLAN:
        for path in product_files(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                    continue
                root = node.module.split(".")[0]
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if root in PACKAGES and root != package and private:
                    offenders.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(private)}")
    assert not offenders, offenders


def resource_packages(source: str) -> set[str]:
    """The packages a file names to `resources.files("pkg")` / `importlib.resources.files("pkg")` (or a bare
    `files("pkg")` imported from importlib.resources) with a constant string: files it reads as package data."""
    tree = ast.parse(source)
    bare = any(isinstance(node, ast.ImportFrom) and node.module == "importlib.resources"
               and any(alias.name == "files" for alias in node.names) for node in ast.walk(tree))
    named = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            continue
        func = node.func
        through_resources = (isinstance(func, ast.Attribute) and func.attr == "files" and (
            isinstance(func.value, ast.Name) and func.value.id == "resources"
            or isinstance(func.value, ast.Attribute) and func.value.attr == "resources"))
        if through_resources or bare and isinstance(func, ast.Name) and func.id == "files":
            named.add(node.args[0].value)
    return named


def resource_violations() -> set[tuple[str, str]]:
    found = set()
    for package, allowed in PLAN.items():
        for path in product_files(package):
            for name in resource_packages(path.read_text()):
                root = name.split(".")[0]
                if root in FORBIDDEN.get(package, set()) or root in PACKAGES and root not in allowed | {package}:
                    found.add((str(path.relative_to(ROOT)), name))
    return found


def test_package_data_is_read_only_from_packages_the_file_may_import():
    """Reading another package's files is importing it by another name (report.html read `draftsmith/static/`
    from the trainer): a constant `resources.files("pkg")` may name only a package the file may import."""
    assert resource_packages('from importlib import resources\nresources.files("api").joinpath("x")') == {"api"}
    assert resource_packages('import importlib.resources\nimportlib.resources.files("report.static")') == {"report.static"}
    assert resource_packages('from importlib.resources import files\nfiles("worker")') == {"worker"}
    offenders = resource_violations()
    assert not offenders, f"package data read from packages the file may not import: {sorted(offenders)}"


def import_with_blocked(modules: str, blocked: set[str]) -> subprocess.CompletedProcess:
    """Import `modules` in a fresh interpreter where every module under `blocked` refuses to load."""
    program = textwrap.dedent(f"""
        import importlib.abc, sys

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {sorted(blocked)!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by test_layout)")
                return None

        sys.meta_path.insert(0, Refuse())
        import {modules}
        print("ok")
    """)
    env = {**os.environ, "DRAFTSMITH_ENV": "development"}
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_worker_imports_without_the_web_framework():
    """The worker runs stages, not HTTP: its modules load with FastAPI and Starlette absent."""
    result = import_with_blocked("worker.app, worker.runner, worker.shards, worker.audits", {"fastapi", "starlette"})
    assert result.returncode == 0, result.stderr[-3000:]
    blocked_really = import_with_blocked("api.main", {"fastapi", "starlette"})
    assert blocked_really.returncode != 0 and "blocked by test_layout" in blocked_really.stderr


def test_the_pipeline_imports_without_torch():
    """trainer/pipeline.py, the stages' one wiring, loads torch only in the stages that use it."""
    result = import_with_blocked("trainer.pipeline", {"torch"})
    assert result.returncode == 0, result.stderr[-3000:]


RUNS_DOORS = {"worker/reporting.py", "worker/runner.py", "worker/app.py"}
"""The worker's door to the stage runs (domain/runs.py): the stage reporter and its JobRecords, the runner that
claims and finishes stages, and app.py's reaper. Everything else in the worker writes a job's records through
a JobRecords (worker/reporting.py)."""


def test_only_the_reporter_and_the_runner_reach_the_stage_runs():
    offenders = sorted(
        str(path.relative_to(ROOT)) for package in PLAN for path in product_files(package)
        if {"domain.runs"} & resolved_imports(path) and str(path.relative_to(ROOT)) not in RUNS_DOORS
        and package != "domain"
    )
    assert not offenders, f"these reach domain/runs.py directly; go through worker/reporting.py: {offenders}"


SQLALCHEMY_IMPORTERS = {
    "api/deps.py",  # the engine's pool events (which connections are checked out) and the session dependency
    "api/problems.py",  # which database errors answer 503 (unreachable, pool exhausted) rather than 500
    "worker/errors.py",  # which database errors are infrastructure, retried rather than failing the job
    "worker/sources.py",  # a session factory's type, annotated in its Caller (another change's file, left as it is)
}
"""The files of api/ and worker/ that may import SQLAlchemy; the queries themselves live in domain/ (and a handle's
type, to annotate with, comes from domain/db.py). A list that may only shrink: a new importer fails, and a file
that no longer imports it fails until its line is deleted here."""


def sqlalchemy_importers() -> set[str]:
    return {str(path.relative_to(ROOT)) for package in ("api", "worker") for path in product_files(package)
            if "sqlalchemy" in imported_roots(path)}


def assert_only_shrinks(found: set, known: set, *, new: str, gone: str, show=sorted) -> None:
    """A ratchet: nothing outside `known` is found (`new` says how to fix it), and every entry of `known` is still
    found (`gone`: delete it, so the list keeps shrinking)."""
    assert not found - known, f"{new}: {show(found - known)}"
    assert not known - found, f"{gone}: {show(known - found)}"


def test_queries_live_in_the_domain():
    assert_only_shrinks(sqlalchemy_importers(), SQLALCHEMY_IMPORTERS,
                        new="SQLAlchemy outside domain/: put the query in domain/ and call it",
                        gone="these no longer import SQLAlchemy: delete them from SQLALCHEMY_IMPORTERS")


SESSION_METHODS = {"add", "add_all", "commit", "execute", "scalar", "scalars", "get", "delete", "flush", "refresh",
                   "merge", "query"}
"""What a database session does that is a query or a write: called on a session in api/ or worker/, it is a query
outside domain/. Ending a session (`close`, `rollback`, `invalidate`, `in_transaction`) is the caller's to do and
is not counted: whoever opens a session ends it."""

SESSION_NAMES = re.compile(r"^(session|db|.*_session)$")
SESSION_TYPE = re.compile(r"\bSession(Dep)?\b")

SESSION_CALLS: dict[str, str] = {}
"""`path::function: receiver.method` -> why that call stays outside domain/, for the session calls in api/ and
worker/. Empty: every query and commit of the API and the worker is a function of domain/ (the transaction boundary
of a request, api/deps.py, only closes sessions). A list that may only shrink, like SQLALCHEMY_IMPORTERS."""


def session_calls(tree: ast.AST) -> list[str]:
    """`function: receiver.method` for each `SESSION_METHODS` call on a session: a name or attribute called
    `session`, `db` or `*_session` (`self.session`), a name annotated with the session type (`Session`,
    `SessionDep`, not a `sessionmaker[Session]`), or a name bound by `with <a session factory>() as name`. A dict's
    `.get` (`claims.get("k")`) is none of these."""
    typed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            annotation = ast.unparse(node.annotation)
            target = node.arg if isinstance(node, ast.arg) else getattr(node.target, "id", None)
            if target and SESSION_TYPE.search(annotation) and "sessionmaker" not in annotation:
                typed.add(target)
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            if isinstance(node.context_expr, ast.Call) and "session" in ast.unparse(node.context_expr.func).lower():
                typed.add(node.optional_vars.id)

    def is_session(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return name is not None and (bool(SESSION_NAMES.match(name)) or isinstance(node, ast.Name) and name in typed)

    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr in SESSION_METHODS and is_session(child.func.value)):
                found.append(f"{where or '<module>'}: {ast.unparse(child.func.value)}.{child.func.attr}")
            visit(child, where)

    visit(tree, "")
    return found


def test_the_session_scan_sees_sessions_and_nothing_else():
    sample = ast.parse(textwrap.dedent("""
        def route(session: SessionDep, claims: dict, services):
            session.add(row)
            key = claims.get("k")
            services.settings.get("x")
            session.close()
        def reader(handle: Session | Connection, factory: sessionmaker[Session]):
            handle.execute(query)
            factory.get()
        def worker(ctx):
            with ctx.session_factory() as s:
                s.get(Job, 1)
            with open("f") as f:
                f.get()
        class Records:
            def write(self, db):
                self.session.commit()
                db.scalar(query)
                self.cache.get("k")
    """))
    assert session_calls(sample) == ["route: session.add", "reader: handle.execute", "worker: s.get",
                                     "Records.write: self.session.commit", "Records.write: db.scalar"]


def test_sessions_are_used_only_in_the_domain():
    """"Every query lives in domain/" for session use, not only for imports: api/ and worker/ call the domain's
    functions (domain/webhooks.py `add_webhook`, domain/keys.py `issue_api_key`, domain/jobs.py `job_by_id`...) and
    never add, commit, execute or get through a session themselves."""
    found = {f"{path}::{call}" for package in ("api", "worker") for path, tree in product_trees()
             if path.startswith(f"{package}/") for call in session_calls(tree)}
    assert_only_shrinks(found, set(SESSION_CALLS),
                        new="a session used outside domain/: move the query into a function of domain/ and call it",
                        gone="these session calls are gone: delete them from SESSION_CALLS")
    assert session_calls(ast.parse((ROOT / "domain" / "runs.py").read_text())), "the scan no longer sees sessions"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolved_imports(path: Path) -> set[str]:
    """The in-repo modules a file imports, function-local imports included; `from pkg import mod` names pkg.mod
    when that is a module, and a relative import is resolved against the file's package."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else []) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            names = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                while name and not is_module(name):
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
    return found


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def file_cycles() -> set[frozenset[str]]:
    """The import circles between product files (strongly connected components of more than one file)."""
    graph = {module_name(path): resolved_imports(path) - {module_name(path)}
             for package in PLAN for path in product_files(package)}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), set(), [0]

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


KNOWN_CYCLES: set[frozenset[str]] = {
    frozenset({"api.admission", "api.deps"}),
    frozenset({"trainer.data.capture", "trainer.data.regenerate"}),
    frozenset({"trainer.export.gguf_tokenizer", "trainer.export.gguf_writer"}),
    frozenset({"trainer.pipeline", "trainer.training.launch"}),
}
"""Today's import circles between files, function-local imports included: they may only shrink."""


def test_no_file_cycles():
    assert_only_shrinks(file_cycles(), KNOWN_CYCLES, new="new import circles between files",
                        gone="these circles are gone: delete them from KNOWN_CYCLES",
                        show=lambda cycles: [sorted(c) for c in cycles])
