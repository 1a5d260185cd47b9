#!/usr/bin/env bash
# Pack what a GPU image without network lacks to run bench/gpu_check.sh (bench/gpu_bundle.py: the list and why).
# Run on the CPU machine, with PyPI reachable:
#   bench/gpu_bundle.sh --list        # resolve the wheel list only (no download)
#   bench/gpu_bundle.sh [OUT]         # wheels + project + target GGUF -> OUT/parts/bundle.tar.partNNN + manifest.json
# Copy OUT/parts/ (every part is under 60 MB: one transfer each) to the GPU machine and run bench/gpu_check.sh there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ "${1:-}" == "--list" ]]; then
    exec "$PYTHON" "$ROOT/bench/gpu_bundle.py" list
fi
exec "$PYTHON" "$ROOT/bench/gpu_bundle.py" build "${1:-$ROOT/out/gpu-bundle}"
