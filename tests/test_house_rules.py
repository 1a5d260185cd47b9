"""docs/ARCHITECTURE.md's house rules beyond the imports and the queries (tests/test_layout.py holds those): one
helper per rule, one meaning per name, functions a reader can hold, comments without issue numbers.

Each rule below has one helper; a ban keeps a second copy from growing back. A ban reads the product packages'
syntax trees, so a comment or a docstring that names the pattern is not a violation.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from test_layout import PLAN, ROOT, assert_only_shrinks, is_module, module_name, product_files, product_trees


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
                       if alias.asname and is_module(f"{node.module}.{alias.name}")]
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


# Functions a reader can hold: no product function over `LIMIT` lines, as a ratchet.
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
