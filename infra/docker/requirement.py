"""Print requirement lines from pyproject.toml, so an image installs exactly what `make setup` pins (one source).

    python requirement.py torch deepspeed     # the lines naming these distributions, one a line
    python requirement.py --extra worker      # the base dependencies and those of the `worker` extra

The output is meant for `| xargs pip install ...`.

Images install torch first from the index of their device (CPU or CUDA build), then the rest, then the project
itself without dependencies, so the heavy layers are cached across code changes.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).with_name("pyproject.toml")  # the build copies both files side by side
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    return [*project["dependencies"], *(line for extra in extras for line in project["optional-dependencies"][extra])]


def distribution(line: str) -> str:
    match = NAME.match(line)
    if match is None:
        raise ValueError(f"not a requirement: {line!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def main(argv: list[str]) -> int:
    pyproject = tomllib.loads(PYPROJECT.read_text())
    if argv[:1] == ["--extra"]:
        print("\n".join(requirements(pyproject, argv[1:])))
        return 0
    every = requirements(pyproject, list(pyproject["project"]["optional-dependencies"]))
    wanted = {distribution(name) for name in argv}
    found = [line for line in every if distribution(line) in wanted]
    missing = wanted - {distribution(line) for line in found}
    if missing:
        print(f"pyproject.toml does not name {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
