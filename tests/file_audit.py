"""What a test's process opens, and adapters that name a base of the test's choosing: the tools the hostile-checkpoint
tests (tests/trainer/, tests/worker/) share to show that nothing a checkpoint names is opened."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, Path)):
        _OPENED.append(os.path.realpath(str(args[0])))


sys.addaudithook(_audit)  # a hook cannot be removed: it records only inside `opened_paths`


@contextmanager
def opened_paths() -> Iterator[list[str]]:
    """Every path this process opens or lists inside the block (CPython's audit events: the file-access audit)."""
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


_ADAPTERS: dict[Path, Path] = {}


def make_adapter(base: Path, out: Path, names: str) -> Path:
    """A LoRA adapter over `base` whose adapter_config.json names `names` as its base (peft saves one adapter per
    base once; each call copies it and rewrites the name)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if base not in _ADAPTERS:
        saved = base.parent / f"{base.name}-lora"
        get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                       LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(saved)
        _ADAPTERS[base] = saved
    shutil.copytree(_ADAPTERS[base], out)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": names}))
    return out
