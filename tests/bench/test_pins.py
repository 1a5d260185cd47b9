"""bench/pins.py: the project's dependency pins read from pyproject.toml, and no bench script or module spelling a
pin of a package the project pins (it reads it instead), but for the versions that differ on purpose."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.pins import PYPROJECT, canonical, project_pins, project_requirements

ROOT = Path(__file__).resolve().parents[2]

DIFFERENT_ON_PURPOSE = {
    # the GPU image's own versions, which the rehearsal installs to stand in for it (docs/DEVICES.md)
    ("bench/gpu_rehearsal.sh", "torch"), ("bench/gpu_rehearsal.sh", "triton"),
    ("bench/gpu_rehearsal.sh", "transformers"),
    # ModelOpt 0.47 supports transformers < 5.15 (the script says why), with the tokenizers and hub that go with it
    ("bench/setup/modelopt.sh", "transformers"), ("bench/setup/modelopt.sh", "tokenizers"),
    ("bench/setup/modelopt.sh", "huggingface-hub"),
    # the speculators venv's own datasets, one release behind the project's
    ("bench/setup/speculators.sh", "datasets"),
}
"""(file, package): a pin spelled in bench/ that differs from pyproject.toml's on purpose. Equal to pyproject's, it
is a second copy and fails: read it with bench/pins.py."""

PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)==(\d[\w.+]*)")


def test_the_pins_are_pyproject_s():
    worker = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["worker"]
    assert project_pins("torch", "huggingface-hub") == [
        next(r for r in worker if r.startswith("torch==")), next(r for r in worker if r.startswith("huggingface_hub=="))]
    assert project_pins("rich", exact=False) == ["rich"]
    with pytest.raises(KeyError, match="does not pin 'rich'"):
        project_pins("rich")
    with pytest.raises(KeyError, match="no-such-package"):
        project_pins("no-such-package")


def test_extras_are_left_out_and_names_compare_as_pip_does(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["celery[redis]==5.7.0", "Foo_Bar==1.0"]\n'
                         '[project.optional-dependencies]\nx = ["baz>=2"]\n')
    assert project_requirements(pyproject) == {"celery": "celery==5.7.0", "foo-bar": "Foo_Bar==1.0", "baz": "baz>=2"}
    assert project_pins("foo.bar", pyproject=pyproject) == ["Foo_Bar==1.0"]


def test_the_command_prints_one_word_per_pin():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pins.py"), "torch", "numpy"], capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == project_pins("torch", "numpy")
    failed = subprocess.run([sys.executable, str(ROOT / "bench" / "pins.py"), "rich"], capture_output=True, text=True)
    assert failed.returncode != 0 and not failed.stdout.strip()


def test_bench_spells_no_pin_the_project_already_pins():
    pinned = {name: requirement.split("==", 1)[1] for name, requirement in project_requirements().items()
              if "==" in requirement}
    spelled = {}
    for path in sorted(ROOT.joinpath("bench").rglob("*")):
        if path.suffix in (".py", ".sh"):
            for name, version in PIN.findall(path.read_text()):
                if canonical(name) in pinned:
                    spelled[(str(path.relative_to(ROOT)), name)] = version
    copies = {key: version for key, version in spelled.items()
              if key not in DIFFERENT_ON_PURPOSE or version == pinned[canonical(key[1])]}
    assert not copies, f"read these from pyproject.toml (bench/pins.py), or say why they differ: {copies}"
    gone = DIFFERENT_ON_PURPOSE - set(spelled)
    assert not gone, f"no longer spelled, delete from DIFFERENT_ON_PURPOSE: {sorted(gone)}"
