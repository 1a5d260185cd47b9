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
                while name and not _is_module(name):
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
    return found


def _is_module(name: str) -> bool:
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


# --- house plan S7: one helper per rule (issue 34) ----------------------------------------------------------------
# Each rule below has one helper; a ban keeps a second copy from growing back. A ban reads the product packages'
# syntax trees, so a comment or a docstring that names the pattern is not a violation.


@functools.cache
def product_trees() -> list[tuple[str, ast.AST]]:
    """(path relative to the repository, syntax tree) of every product file."""
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for package in PLAN
            for path in product_files(package)]


def _is_file_scheme(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower().startswith("file:")


def file_uri_parsers(tree: ast.AST) -> list[int]:
    """Lines that take a file URI apart by hand: `.removeprefix("file://")` (or replace, split, partition, lstrip,
    strip with a `file:` string) or `len("file://")`, the length to slice off."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args or not _is_file_scheme(node.args[0]):
            continue
        method = isinstance(node.func, ast.Attribute) and node.func.attr in {
            "removeprefix", "replace", "split", "rsplit", "partition", "rpartition", "lstrip", "strip"}
        length = isinstance(node.func, ast.Name) and node.func.id == "len"
        if method or length:
            found.append(node.lineno)
    return found


def test_file_uris_are_parsed_by_one_helper():
    """schemas/bounds.py `file_uri_path` is the one parser of a `file://` URI: what admission checked is what the
    worker and the trainer read."""
    offenders = [f"{path}:{line}" for path, tree in product_trees() if path != "schemas/bounds.py"
                 for line in file_uri_parsers(tree)]
    assert not offenders, f"parse file URIs with schemas.bounds.file_uri_path: {offenders}"


ARTIFACT_LOOKUPS_KNOWN: set[str] = set()
"""Today's exceptions to the one artifact lookup, which may only shrink (empty since api/routes/job_data.py's
download route calls domain/artifacts.py `artifact_named`; kept for the ratchet, like `KNOWN`)."""


def artifact_name_comparisons(tree: ast.AST) -> list[int]:
    """Lines that compare `Artifact.name` with something (a lookup by name)."""
    def is_name(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Name)
                and node.value.id == "Artifact")
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(isinstance(op, (ast.Eq, ast.In)) for op in node.ops)
            and any(is_name(side) for side in (node.left, *node.comparators))]


def test_artifacts_are_looked_up_by_name_in_the_domain():
    """domain/artifacts.py `artifact_named` is the one lookup of a job's artifact by name."""
    found = {path: lines for path, tree in product_trees() if not path.startswith("domain/")
             if (lines := artifact_name_comparisons(tree))}
    offenders = {path: lines for path, lines in found.items() if path not in ARTIFACT_LOOKUPS_KNOWN}
    assert not offenders, f"look artifacts up with domain.artifacts.artifact_named: {offenders}"
    assert ARTIFACT_LOOKUPS_KNOWN <= set(found), (
        f"fixed, delete from ARTIFACT_LOOKUPS_KNOWN: {sorted(ARTIFACT_LOOKUPS_KNOWN - set(found))}")


ATOMIC_WRITERS = {"trainer/atomic.py", "domain/storage.py"}
"""The places that rename files: trainer/atomic.py (`atomic_path`, for the trainer, the worker and the CLI), and
domain/storage.py (the storage backend, which hashes what it streams and may not import the trainer). Both fsync
the file before the rename and its directory after."""
RENAMES_ALLOWED = {"api/observability.py"}
"""Renames that are not file writes to keep: api/observability.py publishes each API process's counters every few
seconds for its siblings to read; the rename keeps readers from half a file, and durability is not wanted (a lost
snapshot is simply rewritten; an fsync per publish would be I/O for nothing). The api may not import the trainer."""
RENAMES_KNOWN: set[str] = set()
"""Today's other renames, which may only shrink (empty: kept for the ratchet, like `KNOWN`)."""


def renames(tree: ast.AST) -> list[int]:
    """Lines that rename a file: os.replace, os.rename, os.renames, shutil.move, `path.rename(x)` and
    `path.replace(x)` (one argument: str.replace takes two, dataclasses' and datetimes' replace take keywords)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        attr = node.func.attr
        if (owner == "os" and attr in {"replace", "rename", "renames"}) or (owner == "shutil" and attr == "move"):
            found.append(node.lineno)
        elif attr == "rename" or (attr == "replace" and len(node.args) == 1 and not node.keywords
                                  and owner not in {"dataclasses", "os"}):
            found.append(node.lineno)
    return found


def test_files_are_renamed_by_the_atomic_writers():
    """A file is written whole under its name by trainer/atomic.py `atomic_path` (one fsync policy), not by a
    rename of one's own."""
    found = {path: lines for path, tree in product_trees() if path not in ATOMIC_WRITERS | RENAMES_ALLOWED
             if (lines := renames(tree))}
    offenders = {path: lines for path, lines in found.items() if path not in RENAMES_KNOWN}
    assert not offenders, f"write through trainer.atomic.atomic_path (write, fsync, rename): {offenders}"
    assert RENAMES_KNOWN <= set(found), f"fixed, delete from RENAMES_KNOWN: {sorted(RENAMES_KNOWN - set(found))}"


RESAMPLER = "trainer/bootstrap.py"
"""The one module that draws bootstrap resamples, for validation's report and every bench table."""
INDEX_DRAWS = {"randrange", "randint", "choices", "integers", "multinomial"}
"""Draws of indices with replacement from Python's `random` or numpy: what a bootstrap is made of. torch's own
(`torch.multinomial` samples a token, `torch.randint` makes test inputs) resample nothing; one pick (`choice`)
or a shuffle is not a resample either."""
RESAMPLE_REFERENCES = {"bench/bootstrap_shift.py"}
"""The reference the resampler is measured against: the `random.Random` loops it replaced, kept to state how far
the intervals moved (docs/RESULTS.md) and to test trainer/bootstrap.py against (tests/trainer/test_bootstrap.py).
No interval there reaches a table."""


def resample_draws(tree: ast.AST) -> list[int]:
    """Lines that import scipy's `bootstrap`, call a function named `bootstrap`, or draw indices (`INDEX_DRAWS`)
    from anything but torch."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy"):
            found += [node.lineno for alias in node.names if alias.name == "bootstrap"]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            if name == "bootstrap" or (name in INDEX_DRAWS and owner != "torch"):
                found.append(node.lineno)
    return found


def test_resamples_are_drawn_by_the_one_resampler():
    """trainer/bootstrap.py draws every bootstrap resample, in the product and in bench/ (`RESAMPLE_REFERENCES`, the
    old loops it is measured against, aside): an interval computed by a loop of one's own can differ from the
    report's for the same prompts."""
    bench = [(str(path.relative_to(ROOT)), ast.parse(path.read_text()))
             for path in sorted((ROOT / "bench").rglob("*.py"))]
    trees = dict(product_trees() + bench)
    offenders = {path: lines for path, tree in trees.items() if path != RESAMPLER and path not in RESAMPLE_REFERENCES
                 if (lines := resample_draws(tree))}
    assert not offenders, f"resample through trainer/bootstrap.py: {offenders}"
    assert resample_draws(trees[RESAMPLER]), "the scan no longer sees the resampler's own draws"


REGISTERING_DECORATORS = {"get", "post", "put", "patch", "delete", "head", "options", "websocket", "command",
                          "group"}
"""A function decorated `@router.get(...)` or `@cli.command(...)` is reached by its URL or command, never by its
Python name, so route modules may each have their `create`, `get`, `list_`."""
NAMES_DEFINED_TWICE_ALLOWED = {"_out"}
"""`_out`: each route module's private row -> response model shaper (secrets, webhooks), never imported."""


def module_functions(tree: ast.Module) -> list[str]:
    """The module-level functions a file defines, less those a route or command decorator registers."""
    def registered(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                   and d.func.attr in REGISTERING_DECORATORS for d in node.decorator_list)
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not registered(node)]


def test_a_function_name_means_one_thing_in_the_domain_and_the_api():
    """One name, one meaning: `record_usage` is domain/runs.py's (domain/usage.py appends with `append_usage`),
    `record_drafter` too (domain/drafters.py `upsert_drafter`). Two module-level functions of one name in domain/
    and api/ fail."""
    where: dict[str, list[str]] = {}
    for package in ("domain", "api"):
        for path in product_files(package):
            for name in module_functions(ast.parse(path.read_text())):
                where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1 and name not in NAMES_DEFINED_TWICE_ALLOWED}
    assert not twice, f"one name, two functions; rename one for what it does: {twice}"


NAMED_PACKAGES = ("api", "domain", "worker", "trainer", "schemas", "draftsmith", "report", "kernels")
"""The packages whose top-level names must each mean one thing (migrations/ is left out: every revision file
defines `upgrade` and `downgrade`, Alembic's contract)."""

ENTRY_POINTS = {"main"}
"""A module's `main` is run by `python -m` or a console script, never imported by its name from another package."""

NAMES_IN_TWO_PACKAGES_KNOWN: set[tuple[str, tuple[str, ...]]] = {
    # the drafters table's row (domain/models.py) and the PyTorch model (trainer/drafter/model.py)
    ("Drafter", ("domain", "trainer")),
    # api/estimates.py sizes a target from its spec before any download; trainer/targets/placement.py counts the
    # weights of a loaded folder (the api may not import the trainer)
    ("active_parameters", ("api", "trainer")),
    ("target_parameters", ("api", "trainer")),
    # domain/drafters.py checks a warm start's drafter id at submit; trainer/training/init.py two configs at load
    ("check_warm_start", ("domain", "trainer")),
    # domain/jobs.py parses a request body with the deployment's rules; trainer/cli_run.py a local spec file
    ("parse_spec", ("domain", "trainer")),
}
"""Today's public top-level names defined in two product packages, which may only shrink: rename one side for
what it does and delete its line here."""


def top_level_names(tree: ast.Module) -> list[str]:
    """The public module-level functions and classes a file defines, less those a route or command decorator
    registers (`module_functions`) and entry points. Private names stay out: no package imports another's
    (`test_no_private_name_is_imported_across_packages`), so a reader meets them beside their definition."""
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    return [name for name in module_functions(tree) + classes if not name.startswith("_") and name not in ENTRY_POINTS]


def names_in_two_packages(files: list[tuple[str, ast.Module]]) -> dict[str, dict[str, list[str]]]:
    """name -> {package: [files defining it]}, for the names that more than one package defines."""
    where: dict[str, dict[str, list[str]]] = {}
    for path, tree in files:
        for name in top_level_names(tree):
            where.setdefault(name, {}).setdefault(path.split("/")[0], []).append(path)
    return {name: packages for name, packages in where.items() if len(packages) > 1}


def test_a_top_level_name_means_one_thing_across_packages():
    """One name, one meaning, across every product package: `run_audit` was both the trainer's measurement
    (trainer/audit.py) and the worker's task body (worker/audits.py, now `execute_audit`)."""
    sample = [("worker/a.py", ast.parse("def run_audit(): pass\nclass Beat: pass\ndef _private(): pass\n"
                                        "def main(): pass\n")),
              ("trainer/b.py", ast.parse("def run_audit(): pass\nclass Beat: pass\ndef _private(): pass\n"
                                         "def main(): pass\n@router.get('/x')\ndef get(): pass\n")),
              ("api/c.py", ast.parse("@router.get('/y')\ndef get(): pass\n"))]
    assert set(names_in_two_packages(sample)) == {"run_audit", "Beat"}
    files = [(path, tree) for path, tree in product_trees() if path.split("/")[0] in NAMED_PACKAGES]
    found = {(name, tuple(sorted(packages))) for name, packages in names_in_two_packages(files).items()}
    details = names_in_two_packages(files)
    assert_only_shrinks(found, NAMES_IN_TWO_PACKAGES_KNOWN,
                        new="one name defined in two packages; rename one for what it does",
                        gone="these names mean one thing now: delete them from NAMES_IN_TWO_PACKAGES_KNOWN",
                        show=lambda pairs: {name: details.get(name, packages) for name, packages in sorted(pairs)})


@functools.cache
def product_module_names() -> frozenset[str]:
    """The last part of every product module's name (`runner` for worker/runner.py, `errors` for domain/errors.py)."""
    return frozenset(module_name(path).rpartition(".")[2] for package in PLAN for path in product_files(package))


def misleading_module_aliases(tree: ast.AST) -> list[str]:
    """`import a.b as y` and `from a import b as y` (b an in-repo module) where `y` is the name of another product
    module: `from domain import runs as runner` made `runner` mean domain/runs.py beside worker/runner.py."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliased = [(alias.name, alias.asname) for alias in node.names if alias.asname]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            aliased = [(f"{node.module}.{alias.name}", alias.asname) for alias in node.names
                       if alias.asname and _is_module(f"{node.module}.{alias.name}")]
        else:
            continue
        found += [f"{node.lineno}: {module} as {alias}" for module, alias in aliased
                  if alias in product_module_names() and alias != module.rpartition(".")[2]]
    return found


def test_no_module_is_imported_under_another_modules_name():
    """In product code, tests and bench/: a module keeps its own name or takes one no product module has."""
    assert misleading_module_aliases(ast.parse("from domain import runs as runner\nimport domain.errors as domain\n"
                                               "from domain import shards as claims_db\nimport numpy as np\n"
                                               "from draftsmith.cli import main as cli\n")) == [
        "1: domain.runs as runner", "2: domain.errors as domain"]
    files = [path for package in PLAN for path in product_files(package)]
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))
    offenders = {str(path.relative_to(ROOT)): found for path in files
                 if (found := misleading_module_aliases(ast.parse(path.read_text())))}
    assert not offenders, f"import the module under its own name (or one no product module has): {offenders}"




def test_bundled_targets_are_listed_once():
    """schemas/job_spec.py `BUNDLED_TABLE` is the one table of bundled targets: a dict or set literal keyed by a
    bundled name anywhere else is a second list that can drift."""
    from schemas.job_spec import BUNDLED_TABLE

    def keys(node: ast.AST) -> list[ast.AST]:
        return list(node.keys) if isinstance(node, ast.Dict) else list(node.elts) if isinstance(node, ast.Set) else []
    found = {path for path, tree in product_trees() if path != "schemas/job_spec.py"
             for node in ast.walk(tree) for key in keys(node)
             if isinstance(key, ast.Constant) and key.value in BUNDLED_TABLE}
    assert not found, f"read schemas.job_spec.BUNDLED_TABLE: {sorted(found)}"


# Functions a reader can hold (house plan S8, issue 34): no product function over `LIMIT` lines, as a ratchet.
#
# A function's length is its lines from `def` to its last line (`end_lineno - lineno + 1`; decorators excluded,
# its docstring, comments and blank lines included). A nested function counts twice: within its parent, whose
# span holds it, and on its own, named like Python's `__qualname__` (`outer.<locals>.inner`). Product code is
# every .py file under the product packages; tests/ and bench/ are not measured.
#
# `KNOWN_LONG` lists today's longer functions with their length, and may only shrink: a new function over the
# limit fails, a known one that grew fails, and a known one now at or under the limit (or gone) fails until its
# entry is deleted here. Shorten a long function freely; lower its number here when you do.

LIMIT = 80

PRODUCT_PACKAGES = tuple(PLAN)

KNOWN_LONG: dict[str, int] = {
    "migrations/versions/0001_initial_schema.py::upgrade": 195,  # a migration's DDL, never edited once shipped
    "migrations/versions/0003_fine_tune_pipelines.py::upgrade": 82,  # likewise
    "trainer/export/gguf_tokenizer.py::_special_vocabulary": 109,
    "trainer/validation/engines.py::run_engines": 100,
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


def test_product_code_names_no_issue_numbers():
    """A comment says what and why; a ticket number means nothing to a reader of the repository."""
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = [f"{path.relative_to(ROOT)}:{number}" for package in PRODUCT_PACKAGES for path in product_files(package)
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"say what and why instead of which issue: {found}"
