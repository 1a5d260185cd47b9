#!/usr/bin/env bash
# NVIDIA NeMo Automodel 0.7.0 (its DFlash / DFlash 2 trainer) in its own venv, for bench/peers/compare.py only: a bench
# dependency, never a runtime one (nothing under trainer/, api/ or worker/ imports it; `make run` never needs it).
#
#   bash bench/setup/nemo_automodel.sh [VENV]        # default VENV: .engines/nemo_automodel (ignored by git)
#
# torch 2.13.0 (CPU) goes first: nemo-automodel's own requirements pull CUDA-era packages (megatron-fsdp,
# quack-kernels, flashoptim, mistral-common, tiktoken, ninja) and pin transformers 5.18.0, so it is installed
# --no-deps with only what its DFlash recipes import (the launcher bench/peers/nemo_automodel_launch.py runs them):
# transformers, datasets (its chat dataset; with pyarrow, pandas, dill, multiprocess, xxhash), pillow (imported
# by its dataset package), torchao and torchdata (imported by its model and recipe modules; --no-deps, both
# pure-Python on this path). transformers 5.24.0, the version SpecForge's venv pins, runs its DFlash path.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/setup/peer_venv.sh
peer_venv "NeMo Automodel" .engines/nemo_automodel "${1:-}"
"$VENV/bin/pip" install -q --no-deps nemo-automodel==0.7.0 torchao==0.18.0 torchdata==0.11.0
# The project's pins where it shares a package (bench/pins.py).
shared=$(project_pins transformers safetensors numpy tqdm huggingface-hub pydantic datasets pyarrow)
# shellcheck disable=SC2086  # one word per pin
"$VENV/bin/pip" install -q \
    $shared \
    pyyaml==6.0.4 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 pillow==13.0.0
"$VENV/bin/python" -c "
import torch
from importlib.metadata import version
from nemo_automodel.recipes.llm.train_dflash2 import TrainDFlash2Recipe
print('nemo-automodel', version('nemo-automodel'), 'torch', torch.__version__)"
touch "$VENV/.installed"
