"""Types: mypy over the product packages (pyproject.toml `[tool.mypy]`: strict on schemas/ and domain/, the default
checks elsewhere), each file's error count held to tests/mypy_baseline.txt, a list that only shrinks (the way
tests/test_layout.py holds its exceptions). A file with more errors than its line fails: fix what mypy says. A file
with fewer fails too, until its line is lowered or deleted, so a fix is never silently undone:
`python tests/test_types.py --write` lowers the baseline to what mypy finds now (it never raises a line or adds
one). schemas/ and domain/ have no lines, but for the files in STRICT_PENDING. `make lint` runs this file; how to
run and fix it: docs/ARCHITECTURE.md, "Lint, format, types"."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "mypy_baseline.txt"
STRICT = ("schemas/", "domain/")
# Files of the strict packages that still have a line, each being finished by a change in flight; delete a name
# here with its baseline line.
STRICT_PENDING: set[str] = set()
HEADER = """\
# mypy errors per file (tests/test_types.py): a count may only go down. Lower a line when you fix errors in its
# file (`python tests/test_types.py --write` does it); never add one: fix the new error instead.
"""
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: ")


def mypy_errors() -> tuple[Counter[str], str]:
    """Errors per file (paths from the repository root) of one mypy run, and its output."""
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary", "--no-color-output"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    counts: Counter[str] = Counter()
    for line in run.stdout.splitlines():
        if match := ERROR.match(line):
            counts[match["path"]] += 1
    if run.returncode not in (0, 1) or run.returncode == 1 and not counts:  # 2: a crash or a configuration error
        raise RuntimeError(f"mypy did not run (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    return counts, run.stdout


def read_baseline() -> dict[str, int]:
    lines = (line.split("#")[0].split() for line in BASELINE.read_text().splitlines())
    return {fields[0]: int(fields[1]) for fields in lines if fields}


def problems(counts: Counter[str], baseline: dict[str, int]) -> list[str]:
    found = []
    for path, count in sorted(counts.items()):
        if count > baseline.get(path, 0):
            found.append(f"{path}: {count} mypy errors, the baseline allows {baseline.get(path, 0)}: fix the new ones "
                         f"(`.venv/bin/mypy {path}`)")
    for path, allowed in sorted(baseline.items()):
        if counts[path] < allowed:
            found.append(f"{path}: {counts[path]} mypy errors, fewer than its baseline line ({allowed}): lower it "
                         "(`python tests/test_types.py --write`)")
        if path.startswith(STRICT) and path not in STRICT_PENDING:
            found.append(f"{path}: schemas/ and domain/ are strict and have no baseline: fix its errors, delete its line")
    return found


def test_no_file_has_more_type_errors_than_its_baseline_line():
    counts, output = mypy_errors()
    found = problems(counts, read_baseline())
    assert not found, "\n".join(found) + "\n\nmypy said:\n" + output


def write_lowered_baseline() -> int:
    """Lower each line to the file's count now and drop the lines at 0; refuse when a file has grown."""
    counts, output = mypy_errors()
    baseline = read_baseline()
    grown = [f"{path}: {count} > {baseline.get(path, 0)}" for path, count in sorted(counts.items())
             if count > baseline.get(path, 0)]
    if grown:
        print(output + "\nnot written: these files have more errors than the baseline allows; fix them:\n"
              + "\n".join(grown), file=sys.stderr)
        return 1
    kept = {path: counts[path] for path in sorted(baseline) if counts[path]}
    BASELINE.write_text(HEADER + "".join(f"{path} {count}\n" for path, count in kept.items()))
    print(f"{BASELINE.relative_to(ROOT)}: {sum(baseline.values())} -> {sum(kept.values())} errors in {len(kept)} files")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_types.py --write  (lowers tests/mypy_baseline.txt; pytest runs the check)")
    sys.exit(write_lowered_baseline())
