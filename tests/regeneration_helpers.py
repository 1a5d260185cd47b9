"""What the regeneration tests share: ragged prompt files, and vLLM played by a driver script of the test's own.

vLLM is not installed on CI; trainer/data/vllm_backend.py talks to its driver process over stdin/stdout, so a
script that answers the same lines stands in for it (the real engine is covered by tests/engines when present).
"""

from __future__ import annotations

import json
import shutil
import sys

from trainer.data.prompts import load_prompts


def write_ragged_prompts(path, n):
    """Prompts of different lengths, so batches are ragged and padding matters."""
    with path.open("w") as handle:
        for i in range(n):
            text = " ".join(f"w{(i * 11 + j * 5) % 200}" for j in range(2 + (i * 3) % 9))
            handle.write(json.dumps({"id": f"p{i}", "category": "c", "prompt": text}) + "\n")
    return load_prompts(path)


def install_vllm_driver(target, tmp_path, monkeypatch, source: str, name: str = "driver.py"):
    """`target` with vLLM replaced by the driver script `source`, run by this Python. The target is copied into
    `tmp_path` so the script may write beside it (a log of requests, a marker that slows it down)."""
    from trainer.data import vllm_backend

    driver = tmp_path / name
    driver.write_text(source)
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", sys.executable)
    monkeypatch.setattr(vllm_backend, "DRIVER", driver)
    shutil.copytree(target.path, tmp_path / "target")
    monkeypatch.setattr(target, "path", tmp_path / "target")
    return target
