"""Scripts that print numbers (speed, acceptance, peers, recipe rows) and the libraries they share (`bench.heldout`).

A package of the repository, never of the wheel (pyproject's package list leaves it out): run a script from the
repository root as a module, `python -m bench.peers ...`, so `from bench.heldout import ...` resolves; tests import
`bench.x` the same way. The peer trainers have a room of their own, `bench/peers/` (its `__init__.py` says what
lives there). bench/gpu_check.sh and bench/gpu_bundle.sh run their two scripts by path on purpose (the
GPU check runs the installed project, not the source tree); gpu_bundle.py imports one other bench module, the
standard-library `pins.py` (the project's pins, read from pyproject.toml), from its own folder.
"""
