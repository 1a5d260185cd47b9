#!/usr/bin/env bash
# vLLM speculators 0.9.0 (DFlash, DFlash 2, D-PACE) in its own venv, for bench/peers/compare.py only: a bench dependency,
# never a runtime one (nothing under trainer/, api/ or worker/ imports it; `make run` never needs it).
#
#   bash bench/setup/speculators.sh [VENV]      # default VENV: .engines/speculators (ignored by git)
#
# torch 2.13.0 (CPU) goes first: speculators' own requirements name torchvision/torchaudio and CUDA-era extras, so
# it is installed --no-deps, with hs-connectors (its hidden-state file reader, also --no-deps) and only what its
# offline trainer imports, at versions that work. Its metadata caps transformers at 5.19.0; 5.24.0 (the project's
# and SpecForge's) trains and exports here. The run is bench/peers/speculators_launch.py (CPU overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/setup/peer_venv.sh
peer_venv "speculators" .engines/speculators "${1:-}"
"$VENV/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
# The project's pins where it shares a package (bench/pins.py); datasets 5.1.0 is this venv's own.
shared=$(project_pins transformers safetensors numpy tqdm huggingface-hub pydantic pydantic-settings httpx pyarrow)
# shellcheck disable=SC2086  # one word per pin
"$VENV/bin/pip" install -q \
    $shared \
    psutil==7.2.2 requests==2.34.2 pyyaml==6.0.4 typer==0.29.2 rich==15.0.0 loguru==0.7.3 openai==3.63.0 \
    datasets==5.1.0 pandas==3.1.1 fsspec==2026.7.0
"$VENV/bin/python" -c "import speculators, torch; from importlib.metadata import version; from speculators.train.cli import main; print('speculators', version('speculators'), 'torch', torch.__version__)"
touch "$VENV/.installed"
