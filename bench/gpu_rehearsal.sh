#!/usr/bin/env bash
# Rehearse the GPU machine's install on this CPU machine before spending device minutes:
#   bench/gpu_rehearsal.sh [DIR]     (log: /tmp/gpu_rehearsal.log)
# 1. An "image": a Python 3.12 venv holding what the GPU image holds (torch 2.11, triton 3.6, transformers 5.17 and
#    their requirements; PyPI's torch 2.11 is a CUDA build that runs on the CPU here). The image's python3 is itself a
#    venv, so this one is too.
# 2. The bundle's parts (bench/gpu_bundle.sh, built once into DIR/bundle) installed offline exactly as
#    bench/gpu_check.sh does it there: pip --no-index --no-deps --target into a directory on PYTHONPATH.
# 3. The import preflight and the check's dry run (CPU, tiny shapes) on that interpreter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/build/gpu-rehearsal}"
LOG=/tmp/gpu_rehearsal.log
exec > >(tee "$LOG") 2>&1
started=$(date +%s)
# The image's Python minor version. A pyenv shim on PATH may name python3.12 without running it: take the first
# candidate that runs.
if [[ -z "${PY312:-}" ]]; then
    for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
        if "$candidate" -c "" 2>/dev/null; then PY312="$candidate"; break; fi
    done
fi
: "${PY312:?no Python 3.12 here: set PY312 to one (the GPU image runs 3.12)}"
IMAGE="$DIR/image"
if [[ ! -f "$IMAGE/.complete" ]]; then
    "$PY312" -m venv "$IMAGE"
    "$IMAGE/bin/python" -m pip install --quiet torch==2.11.0 triton==3.6.0 transformers==5.17.0
    touch "$IMAGE/.complete"
fi
"$IMAGE/bin/python" -c "import sys, torch, transformers, triton; print('image:', sys.version.split()[0], \
'torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
if [[ ! -f "$DIR/bundle/parts/manifest.json" ]]; then
    "$ROOT/bench/gpu_bundle.sh" "$DIR/bundle"
fi
# No network from here on, as on the GPU machine: pip gets --no-index, and the check's code downloads nothing.
SYSTEM_PYTHON="$IMAGE/bin/python" GPU_CHECK_CPU=1 "$ROOT/bench/gpu_check.sh" --dry-run "$DIR/work" "$DIR/bundle/parts"
echo "rehearsal passed in $(( $(date +%s) - started )) s"
