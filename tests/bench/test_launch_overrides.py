"""The peers' launchers (bench/peers/*_launch.py) replace a few torch functions at run time (a CPU device, Muon's
float32 iteration, AdamW's betas). A torch release that renames or reshapes one would make the override replace
nothing, or be called with arguments it does not take, and the peer's row would run its authors' code unnoticed.
Here, against the torch installed in the project's venv (bench/setup/peer_venv.sh installs the project's torch pin
in every peer venv): each function a launcher replaces still exists, with the parameters the override assumes, and
the launchers replace no torch function this table does not name. The launchers themselves are read, never
imported (they import the peers, which live in their own venvs). Under a second."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = sorted(ROOT.joinpath("bench").rglob("*_launch.py"))

OVERRIDES: dict[str, dict[str, tuple[str, ...]]] = {
    "bench/peers/speculators_launch.py": {
        # a no-op without an accelerator, else the original called with the same (positional) device
        "torch.accelerator.synchronize": ("device",),
        # a subclass that passes `params` on and sets `betas` by keyword
        "torch.optim.AdamW": ("params", "betas"),
        # the launcher's float32 Newton-Schulz iteration, called by Muon's step with these four
        "torch.optim._muon._zeropower_via_newtonschulz": ("grad", "ns_coefficients", "ns_steps", "eps"),
    },
    "bench/peers/nemo_automodel_launch.py": {
        "torch.cuda.current_device": (),  # `lambda: 0`: called with no argument
    },
    "bench/peers/modelopt_launch.py": {},
}
"""launcher -> {the torch function it replaces: the parameters its override relies on}."""

CALLED = {
    # speculators_launch.py's override 2 asks whether there is an accelerator before it synchronises one
    "torch.accelerator.is_available": (),
}
"""torch functions an override calls (not replaces), with the parameters it passes."""


def resolve(dotted: str):
    """The object `a.b.c` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def parameters(function) -> list[str]:
    """Parameter names of a function, or of a class's constructor (less `self`)."""
    signature = inspect.signature(function.__init__ if inspect.isclass(function) else function)
    return [name for name in signature.parameters if name != "self"]


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`torch.optim.AdamW` for an Attribute chain, with an imported alias (`muon_module`) spelled out."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(names)])


def torch_overrides(path: Path) -> dict[str, list[str] | None]:
    """Every torch attribute the launcher assigns: {dotted name: the replacement's own parameters, when it is a
    function or lambda of named parameters (None: a class, or one that passes *args/**kwargs through)}."""
    tree = ast.parse(path.read_text())
    aliases = {alias.asname: alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names if alias.asname}
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    found: dict[str, list[str] | None] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            name = dotted_name(target, aliases)
            if not name or not name.startswith("torch."):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in functions:
                value = functions[value.id]
            args = value.args if isinstance(value, ast.Lambda | ast.FunctionDef) else None
            plain = args is not None and args.vararg is None and args.kwarg is None
            found[name] = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs] if plain else None
    return found


def test_every_launcher_is_in_the_table():
    assert {str(path.relative_to(ROOT)) for path in LAUNCHERS} == set(OVERRIDES)


@pytest.mark.parametrize("launcher", sorted(OVERRIDES))
def test_the_launcher_replaces_only_what_the_table_names(launcher):
    assert set(torch_overrides(ROOT / launcher)) == set(OVERRIDES[launcher]), (
        f"{launcher}: a torch override to add to (or delete from) OVERRIDES here, with what it assumes")


@pytest.mark.parametrize("launcher, name", [(launcher, name) for launcher, names in OVERRIDES.items()
                                            for name in names])
def test_each_replaced_function_still_takes_what_the_override_assumes(launcher, name):
    try:
        original = resolve(name)
    except (ImportError, AttributeError):
        pytest.fail(f"{launcher} replaces {name}, which torch {torch.__version__} no longer has: the override would "
                    "replace nothing")
    has = parameters(original)
    assert set(OVERRIDES[launcher][name]) <= set(has), (name, has)
    own = torch_overrides(ROOT / launcher)[name]
    if own is not None:  # a replacement of named parameters is called as the original is: the same ones, in order
        assert own == has, f"{launcher}: {name} takes {has} in torch {torch.__version__}, its override {own}"


@pytest.mark.parametrize("name", sorted(CALLED))
def test_each_function_an_override_calls_is_still_there(name):
    assert set(CALLED[name]) <= set(parameters(resolve(name)))


def test_muon_still_looks_its_iteration_up_by_its_module_name():
    """Replacing `torch.optim._muon._zeropower_via_newtonschulz` changes Muon's step only while the step calls it
    through the module's globals."""
    import torch.optim._muon as muon

    calls = [node for node in ast.walk(ast.parse(inspect.getsource(muon))) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "_zeropower_via_newtonschulz"]
    assert calls, f"torch {torch.__version__}'s Muon no longer calls _zeropower_via_newtonschulz by name"
