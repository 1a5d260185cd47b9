#!/usr/bin/env bash
# NVIDIA ModelOpt 0.47.0 (DFlash with D-PACE, offline training) in its own venv, for bench/peers/compare.py only: a bench
# dependency, never a runtime one (nothing under trainer/, api/ or worker/ imports it; `make run` never needs it).
#
#   bash bench/setup/modelopt.sh [VENV]        # default VENV: .engines/modelopt (ignored by git)
#
# torch 2.13.0 (CPU) goes first: an unpinned torch would be a CUDA build. nvidia-modelopt goes in --no-deps with
# only what `modelopt.torch.speculative`, `modelopt.recipe` and `modelopt.torch.export` import (requests,
# omegaconf, pulp<4, scipy) plus transformers and accelerate for its HF Trainer path. transformers is 5.14.1, not
# SpecForge's 5.24.0: ModelOpt 0.47 supports transformers <5.15 ([hf] extra), and under 5.24 its DFlash module
# fails (Qwen3RotaryEmbedding no longer takes `device`). Its other declared needs (ninja, nvidia-ml-py) are for
# CUDA kernels and GPU queries and are never imported on this path.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/setup/peer_venv.sh
peer_venv "ModelOpt" .engines/modelopt "${1:-}"
"$VENV/bin/pip" install -q --no-deps nvidia-modelopt==0.47.0
# The project's pins where it shares a package (bench/pins.py); ModelOpt's own transformers, tokenizers and hub.
shared=$(project_pins accelerate safetensors pydantic numpy tqdm scipy)
# shellcheck disable=SC2086  # one word per pin
"$VENV/bin/pip" install -q transformers==5.14.1 tokenizers==0.22.2 huggingface-hub==1.33.0 \
    $shared \
    pyyaml==6.0.4 psutil==7.2.2 requests==2.34.2 omegaconf==2.4.0 pulp==3.3.2 rich==15.0.0 packaging==26.4 \
    regex==2026.12.2
HF_HUB_OFFLINE=1 "$VENV/bin/python" -W ignore -c "
import torch, transformers, modelopt
import modelopt.torch.speculative, modelopt.recipe, modelopt.torch.export
print('modelopt', modelopt.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$VENV/.installed"
