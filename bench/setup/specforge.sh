#!/usr/bin/env bash
# SpecForge 0.2.0 (the open-source DFlash trainer) in its own venv, for bench/peers/compare.py only: a bench
# dependency, never a runtime one (nothing under trainer/, api/ or worker/ imports it; `make run` never needs it).
#
#   bash bench/setup/specforge.sh [VENV]        # default VENV: .engines/specforge (ignored by git)
#
# torch 2.13.0 (CPU) goes first: specforge's own requirements name CUDA builds (and sglang), so it is installed
# --no-deps with only what its DFlash offline trainer and `specforge export` import, at versions that work.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/setup/peer_venv.sh
peer_venv "SpecForge" .engines/specforge "${1:-}"
"$VENV/bin/pip" install -q --no-deps specforge==0.2.0
# The project's pins where it shares a package (bench/pins.py).
shared=$(project_pins transformers accelerate pydantic safetensors numpy tqdm huggingface-hub pyarrow)
# shellcheck disable=SC2086  # one word per pin
"$VENV/bin/pip" install -q \
    $shared \
    pyyaml==6.0.4 psutil==7.2.2 requests==2.34.2
"$VENV/bin/python" -c "import specforge, torch; print('specforge', specforge.__version__ if hasattr(specforge, '__version__') else '0.2.0', 'torch', torch.__version__)"
touch "$VENV/.installed"
