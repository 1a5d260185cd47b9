# Sourced by bench/setup/<peer>.sh from the repository root. `peer_venv LABEL DEFAULT_VENV [VENV]` sets VENV and ends
# the calling script when that venv is already installed (its .installed marker, touched last); otherwise it makes
# the venv and installs torch 2.13.0 first: the CPU build on this disk, where an unpinned torch, asked for by the
# peer or anything it pulls, would be a multi-GB CUDA build. `project_pins NAME...` prints the project's own pins of
# those packages, read from pyproject.toml (bench/pins.py), so a version the project and a peer share is written once.
project_pins() {
    "${PY:-python3.11}" bench/pins.py "$@"
}
peer_venv() {
    VENV=${3:-$2}
    if [ -f "$VENV/.installed" ]; then
        echo "$1 venv ready: $VENV"; exit 0
    fi
    test -x "$VENV/bin/python" || "${PY:-python3.11}" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    local torch_pin
    torch_pin=$(project_pins torch)
    "$VENV/bin/pip" install -q "$torch_pin"
}
