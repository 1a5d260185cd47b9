"""The project's dependency pins, read from pyproject.toml: the one place a version the project runs is written.

A bench venv (bench/setup/*.sh) or the GPU bundle (bench/gpu_bundle.py) that installs a package the project
also pins takes the project's requirement from here instead of spelling it again, so a change to pyproject.toml
changes them too. Packages the project does not pin (a peer's own, or a version a peer needs that differs from
ours, said why where it is spelled) stay where they are used; tests/bench/test_pins.py holds the rest to this.

    python bench/pins.py torch numpy scipy      # prints their pins, one word each: torch==X numpy==Y scipy==Z

Standard library only, and run by path: a setup script calls it with any Python 3.11 before the project is
installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def canonical(name: str) -> str:
    """A distribution's name as pip compares it: `huggingface_hub` and `huggingface-hub` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Every requirement pyproject.toml declares (the base set and each extra), by canonical name, as written less
    its extras (`name[extra]==1.0` -> `name==1.0`)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = {}
    for requirement in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                                   for r in extra)]:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)", requirement)
        if match is None:
            raise ValueError(f"{pyproject}: cannot read the requirement {requirement!r}")
        name, _, rest = match.groups()
        found[canonical(name)] = f"{name}{rest.strip()}"
    return found


def project_pins(*names: str, exact: bool = True, pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's requirement of each of `names`, in order: its exact pin (`name==version`), or with
    `exact=False` whatever it declares (`rich`). A name the project does not declare, or with `exact` does not pin
    exactly, is an error, so a caller never installs an unpinned package believing it pinned."""
    requirements = project_requirements(pyproject)
    pins = []
    for name in names:
        requirement = requirements.get(canonical(name))
        if requirement is None or (exact and "==" not in requirement):
            raise KeyError(f"pyproject.toml does not pin {name!r} (it has {requirement!r}): pin it there first")
        pins.append(requirement)
    return pins


def main(argv: list[str] | None = None) -> None:
    names = sys.argv[1:] if argv is None else argv
    try:
        print(" ".join(project_pins(*names)))
    except KeyError as error:
        sys.exit(f"bench/pins.py: {error.args[0]}")


if __name__ == "__main__":
    main()
