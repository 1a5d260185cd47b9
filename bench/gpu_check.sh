#!/usr/bin/env bash
# One-command GPU check (issue 35; docs/DEVICES.md "Checking a GPU machine"): on one GPU, with no network,
#   bench/gpu_check.sh PARTS_DIR [WORK_DIR]   reassemble and verify the bundle (bench/gpu_bundle.sh made it), install the
#                                             bundle offline into a PYTHONPATH directory over the image's CUDA torch, run
#                                             `draftsmith run --preset gpu --device cuda` on SmolLM2-135M and print
#                                             the table (bench/gpu_check.py)
#   bench/gpu_check.sh --dry-run [WORK_DIR]   the same code paths on this machine's CPU with tiny shapes (the project's
#                                             .venv); PARTS_DIR after it installs that bundle over $SYSTEM_PYTHON as on the GPU
#                                             (bench/gpu_rehearsal.sh does this with a stand-in image)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

install_bundle() {   # PARTS WORK: assemble, install into WORK/site, export PYTHONPATH, preflight
    local PARTS="$1" WORK="$2"
    # absolute, without resolving links: a venv's python resolved to its base interpreter loses the venv's packages
    case "$SYSTEM_PYTHON" in */*) SYSTEM_PYTHON="$(cd "$(dirname "$SYSTEM_PYTHON")" && pwd)/$(basename "$SYSTEM_PYTHON")";; esac
    "$SYSTEM_PYTHON" "$ROOT/bench/gpu_bundle.py" assemble "$PARTS" "$WORK/bundle"
    # The image's python3 is itself a venv: a venv made from it with --system-site-packages sees the base interpreter's
    # packages, not the image's CUDA torch. So the bundle goes into a plain directory on PYTHONPATH, and the image's own
    # interpreter (its torch and triton) runs everything; PYTHONPATH comes before site-packages, so the bundle's pinned
    # transformers shadows the image's. --upgrade --force-reinstall: a patched wheel of the same version replaces the old.
    SITE="$WORK/site"
    "$SYSTEM_PYTHON" -m pip install --quiet --no-index --no-deps --ignore-requires-python --upgrade --force-reinstall \
        --target "$SITE" "$WORK"/bundle/wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    # Fail in seconds, naming every module that does not import, before minutes of loading and training.
    DRY_RUN=$DRY_RUN SITE="$SITE" "$SYSTEM_PYTHON" - <<'PY'
import importlib
missing = []
for name in ("torch", "triton", "transformers", "accelerate", "pyarrow.parquet", "scipy.stats", "gguf", "peft",
             "deepspeed", "pydantic", "click", "rich", "safetensors", "tokenizers", "draftsmith.cli", "trainer.pipeline"):
    try:
        importlib.import_module(name)
    except Exception as error:  # an ImportError, or a binary built for another ABI
        missing.append(f"{name}: {type(error).__name__}: {error}")
if missing:
    raise SystemExit("gpu_check preflight: these do not import:\n  " + "\n  ".join(missing))
import os, torch, triton
for module in (torch, triton):  # the image's CUDA builds, never a copy the bundle brought along
    if os.path.realpath(module.__file__).startswith(os.path.realpath(os.environ["SITE"])):
        raise SystemExit(f"gpu_check preflight: {module.__name__} {module.__version__} was installed from the bundle "
                         f"({module.__file__}), shadowing the image's; rebuild the bundle (bench/gpu_bundle.py)")
if os.environ["DRY_RUN"] == "0":
    assert torch.cuda.is_available(), "no CUDA device visible"
print("preflight: every module imports; torch", torch.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no CUDA device)")
PY
}

if [[ $DRY_RUN == 1 ]]; then
    WORK="${1:-$ROOT/out/gpu-check-dry}"
    mkdir -p "$WORK"
    if [[ -n "${2:-}" ]]; then
        SYSTEM_PYTHON="${SYSTEM_PYTHON:-python3}"
        install_bundle "$2" "$WORK"
        cd "$WORK"
        exec "$SYSTEM_PYTHON" "$ROOT/bench/gpu_check.py" --dry-run --out "$WORK/run"
    fi
    PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
    exec "$PYTHON" "$ROOT/bench/gpu_check.py" --dry-run --out "$WORK/run"
fi
PARTS="${1:?usage: bench/gpu_check.sh PARTS_DIR [WORK_DIR] | --dry-run [WORK_DIR [PARTS_DIR]]}"
WORK="${2:-$ROOT/out/gpu-check}"
SYSTEM_PYTHON="${SYSTEM_PYTHON:-python3}"
mkdir -p "$WORK"
install_bundle "$PARTS" "$WORK"
cd "$WORK"   # the installed project, not the source tree, is what runs
exec "$SYSTEM_PYTHON" "$ROOT/bench/gpu_check.py" --out "$WORK/run"
