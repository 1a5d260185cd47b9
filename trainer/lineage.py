"""What code trained a drafter: the Draftsmith version (and git commit when known) and the versions of the
packages that shape the numbers. The train stage records it (the worker puts it in its stage marker, the service
in the drafter's lineage), so two drafters can be compared knowing whether the code under them differed."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path

PACKAGES = ("torch", "transformers", "deepspeed", "safetensors", "tokenizers", "numpy", "dflash")


@cache
def git_commit() -> str | None:
    """`DRAFTSMITH_BUILD_COMMIT` (set by image builds), else the checkout's HEAD, else None."""
    if os.environ.get("DRAFTSMITH_BUILD_COMMIT"):
        return os.environ["DRAFTSMITH_BUILD_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+modified" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def draftsmith_version() -> str | None:
    """The installed distribution's version (pyproject's `version`), read from its metadata, not by importing the
    `draftsmith` package (the trainer never imports it: tests/test_layout.py); None when not installed."""
    try:
        return importlib.metadata.version("draftsmith")
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"draftsmith": draftsmith_version(), "git_commit": git_commit(), "python": sys.version.split()[0],
            "platform": platform.platform(terse=True), "device": device, "packages": versions}
