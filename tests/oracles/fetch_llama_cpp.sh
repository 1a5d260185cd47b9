#!/usr/bin/env bash
# Fetch llama.cpp's own HF -> GGUF converter, the test oracle for trainer/export (GGUF parity).
#
# It is vendored in the PyPI sdist of llama-cpp-python; only convert_hf_to_gguf.py, conversion/
# and gguf-py/ (the gguf package that knows the `dflash` architecture) are kept, under DEST_DIR.
# Usage: tests/oracles/fetch_llama_cpp.sh DEST_DIR      (PYTHON selects the pip to use)
# The tests look in $DRAFTSMITH_LLAMA_CPP_DIR, then <repo>/.venv/share/llama.cpp.
set -euo pipefail

dest=${1:?usage: $0 DEST_DIR}
python=${PYTHON:-python3}
version=0.3.36
prefix="llama_cpp_python-${version}/vendor/llama.cpp"

if [[ -f "$dest/convert_hf_to_gguf.py" && -d "$dest/conversion" && -d "$dest/gguf-py" ]]; then
    echo "llama.cpp converter already in $dest"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==${version}" -d "$work"
tar -xzf "$work/llama_cpp_python-${version}.tar.gz" -C "$work" \
    "$prefix/convert_hf_to_gguf.py" "$prefix/conversion" "$prefix/gguf-py"

# Move into place only once complete, so an interrupted fetch never looks like a valid oracle.
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$work/$prefix" "$dest"
echo "llama.cpp converter (llama-cpp-python ${version}) in $dest"
