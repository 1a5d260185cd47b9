"""docs/ARCHITECTURE.md's claims that a test can check ("This file describes today's tree"); the import plan and the
house rules themselves are tests/test_layout.py's and tests/test_house_rules.py's.

Each test reads the doc, so a claim that stops being true fails here until the doc (or the tree) is fixed.
"""

from __future__ import annotations

import ast
import re
import subprocess

import test_house_rules
import test_layout
from test_layout import PACKAGES, ROOT, imported_modules, product_files, resource_packages

DOC = ROOT / "docs" / "ARCHITECTURE.md"


def section(title: str) -> str:
    """The doc's text from `## title` to the next `## ` heading."""
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def room_rows() -> dict[str, list[str]]:
    """`room` -> its row's cells (what lives there, imports today), from the table of "The rooms"."""
    rows = {}
    for line in section("The rooms").splitlines():
        if match := re.match(r"\| `([a-z_]+)/` \|(.*)\|\s*$", line):
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_the_rooms_table_names_every_room_and_each_exists():
    rows = room_rows()
    assert set(PACKAGES) <= set(rows), f"rooms without a row: {sorted(set(PACKAGES) - set(rows))}"
    missing = [room for room in rows if not (ROOT / room).is_dir()]
    assert not missing, f"rows for rooms the tree does not have: {missing}"


TRACKED = frozenset(subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                                   check=True).stdout.splitlines())
PATHS_NOT_IN_THE_TREE = {"control/", "./control/", "path/to/file.py", ".mypy_cache/"}
"""Paths the doc names that are not files of the repository: the domain package's first name and the folder kombu's
broker writes (why it was renamed), a placeholder, and mypy's cache."""


def named_paths(text: str) -> set[str]:
    """Backticked tokens that look like a file or folder path (`db.py`, `api/routes/`, `targets/families.py`),
    with `::function` and `:name` suffixes dropped; not a URL path (`/readyz`)."""
    found = set()
    for token in backticked(text):
        token = token.split("::")[0].split(":")[0]
        if re.fullmatch(r"[\w.-][\w./-]*", token) and ("/" in token or re.search(r"\.(py|json|md|sh)$", token)):
            found.add(token)
    return found


def exists_in_the_tree(path: str) -> bool:
    """A file or folder of the repository (tracked, or new and not ignored) whose path is `path` or ends with `/path` (the doc names files within their room)."""
    stripped = path.rstrip("/")
    if path.endswith("/"):
        return any(f"/{stripped}/" in f"/{tracked}" for tracked in TRACKED)
    return any(tracked == stripped or tracked.endswith(f"/{stripped}") for tracked in TRACKED)


def test_every_file_and_folder_the_doc_names_exists():
    missing = sorted(path for path in named_paths(DOC.read_text()) - PATHS_NOT_IN_THE_TREE
                     if not exists_in_the_tree(path))
    assert not missing, f"docs/ARCHITECTURE.md names paths the tree does not have: {missing}"
    assert {"domain/runs.py", "statuses.py", "api/routes/"} <= named_paths(DOC.read_text())


def imported_packages(room: str) -> set[str]:
    """The other in-repo packages a room's files import, or read package data from."""
    found = set()
    for path in product_files(room):
        names = imported_modules(path) | resource_packages(path.read_text())
        found |= {name.split(".")[0] for name in names} & PACKAGES
    return found - {room}


def test_each_room_imports_the_packages_its_row_names():
    """The "imports today" column: the in-repo packages named before "never" are what the room imports."""
    wrong = {}
    for room, cells in room_rows().items():
        if room not in PACKAGES:
            continue
        named = {token for token in backticked(cells[-1].split("never")[0]) if token in PACKAGES}
        if named != (actual := imported_packages(room)):
            wrong[room] = {"named": sorted(named), "imported": sorted(actual)}
    assert not wrong, f"docs/ARCHITECTURE.md's 'imports today' differ from the imports: {wrong}"


def test_the_worker_reaches_the_trainer_through_the_modules_its_row_names():
    cell = room_rows()["worker"][-1]
    named = {f"trainer.{name}" for name in backticked(cell[cell.index("public entry points"):cell.index("`schemas`")])}
    imported = {module for path in product_files("worker") for module in imported_modules(path)
                if module.startswith("trainer.")}
    assert named == imported, f"the worker row names {sorted(named)}; the worker imports {sorted(imported)}"


def test_the_command_row_names_every_module_of_a_subcommand():
    """draftsmith/cli.py's table of lazily imported subcommands, against the files the `draftsmith/` row lists."""
    tree = ast.parse((ROOT / "draftsmith" / "cli.py").read_text())
    targets = {node.value.split(":")[0] for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and re.fullmatch(r"[a-z_.]+:[a-z_]+", node.value)}
    modules = {target.replace(".", "/") + ".py" for target in targets}
    cell = room_rows()["draftsmith"][0]
    named = {path for path in backticked(cell[:cell.index("the HTTP client")]) if path.endswith(".py")}
    assert modules == named, f"subcommands live in {sorted(modules)}; the row names {sorted(named)}"


def test_the_worker_row_names_the_tasks_the_worker_registers():
    from domain import queue

    tasks = {value for name, value in vars(queue).items() if name.endswith("_TASK")}
    named = set(re.findall(r"`(draftsmith\.\w+)\(", room_rows()["worker"][0]))
    assert tasks == named, f"the worker's tasks are {sorted(tasks)}; the row names {sorted(named)}"


def test_the_tests_row_names_every_folder_of_tests():
    folders = {path.name for path in (ROOT / "tests").iterdir()
               if path.is_dir() and not path.name.startswith((".", "__")) and any(path.iterdir())}
    named = {token.rstrip("/") for token in backticked(room_rows()["tests"][0])
             if re.fullmatch(r"[a-z_]+/", token)} - {"domain", "migrations", "schemas"}
    assert folders == named, f"tests/ has {sorted(folders)}; the row names {sorted(named)}"


def test_the_flow_names_the_stages_in_order():
    from schemas.stages import STAGE_ORDER

    flow = re.search(r"worker: ([a-z →]+)\n", section("What flows between them"))
    assert flow is not None
    assert flow.group(1).strip().split(" → ") == [str(stage) for stage in STAGE_ORDER]


RULE_TESTS: dict[str, set[str]] = {
    "Imports": {"test_imports_follow_the_plan", "test_known_exceptions_still_exist", "test_imports_flow_one_way",
                "test_no_private_name_is_imported_across_packages",
                "test_package_data_is_read_only_from_packages_the_file_may_import",
                "test_the_worker_imports_without_the_web_framework", "test_the_pipeline_imports_without_torch",
                "test_no_file_cycles"},
    "Queries live in `domain/`": {"test_queries_live_in_the_domain", "test_the_session_scan_sees_sessions_and_nothing_else",
                                  "test_sessions_are_used_only_in_the_domain",
                                  "test_only_the_reporter_and_the_runner_reach_the_stage_runs"},
    "One helper per rule": {"test_file_uris_are_parsed_by_one_helper",
                            "test_artifacts_are_looked_up_by_name_in_the_domain",
                            "test_files_are_renamed_by_the_atomic_writers",
                            "test_resamples_are_drawn_by_the_one_resampler", "test_bundled_targets_are_listed_once"},
    "One meaning per name": {"test_a_function_name_means_one_thing_in_the_domain_and_the_api",
                             "test_a_top_level_name_means_one_thing_across_packages",
                             "test_no_module_is_imported_under_another_modules_name"},
    "Functions a reader can hold": {"test_no_function_over_80_lines",
                                    "test_lengths_count_from_def_to_the_last_line_nested_functions_twice"},
    "Comments say what and why": {"test_product_code_names_no_issue_numbers"},
    "This file describes today's tree": {"test_architecture_table_matches_plan"},
}
"""Each house rule of docs/ARCHITECTURE.md (its bold title) -> the tests of tests/test_layout.py and
tests/test_house_rules.py that hold it."""
RULE_MODULES = (test_layout, test_house_rules)


def test_each_house_rule_is_a_test_and_each_test_a_house_rule():
    """"Each is a test in tests/test_layout.py or tests/test_house_rules.py": the doc's rules are RULE_TESTS' keys,
    and the tests there are its values; a new rule or a new test names its partner here."""
    rules = re.findall(r"^- \*\*(.+?)\*\*", section("The house rules"), flags=re.MULTILINE)
    assert rules == list(RULE_TESTS), f"the doc's rules are {rules}"
    tests = {name for module in RULE_MODULES for name in vars(module) if name.startswith("test_")}
    mapped = set().union(*RULE_TESTS.values())
    assert mapped == tests, f"tests without a rule: {sorted(tests - mapped)}; gone: {sorted(mapped - tests)}"


def test_the_lists_the_rules_name_are_in_the_rule_tests():
    """Every list the house rules and the rooms name (`KNOWN_LONG`, `SESSION_CALLS`...) is one of tests/test_layout.py's
    or tests/test_house_rules.py's, and those that are empty today and said so are empty."""
    text = section("The rooms") + section("The house rules")
    lists = {token for token in backticked(text) if re.fullmatch(r"[A-Z][A-Z_]+", token)}
    assert lists >= {"PLAN", "KNOWN", "FORBIDDEN", "KNOWN_CYCLES", "SQLALCHEMY_IMPORTERS", "SESSION_CALLS", "KNOWN_LONG"}
    held = {name: getattr(module, name) for module in RULE_MODULES for name in lists if hasattr(module, name)}
    missing = sorted(lists - set(held))
    assert not missing, f"the doc names lists the rule tests do not have: {missing}"
    said_empty = set(re.findall(r"`([A-Z_]+)`, empty\)", text))
    assert said_empty == {"SESSION_CALLS"} and not any(held[name] for name in said_empty)


def test_the_type_check_is_as_the_doc_says():
    """"Lint, format, types": `make lint` runs ruff and tests/test_types.py, before pytest in `make test`; `schemas/`
    and `domain/` have no baseline lines and `STRICT_PENDING` is empty."""
    import test_types

    makefile = (ROOT / "Makefile").read_text()
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, flags=re.MULTILINE)
    assert lint is not None and "ruff check ." in lint.group(1) and "tests/test_types.py" in lint.group(1)
    assert re.search(r"^test:.*\blint\b", makefile, flags=re.MULTILINE)
    baseline = (ROOT / "tests" / "mypy_baseline.txt").read_text().splitlines()
    assert not [line for line in baseline if line.startswith(("schemas/", "domain/"))]
    assert not test_types.STRICT_PENDING
