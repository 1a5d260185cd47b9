#!/usr/bin/env bash
# Build llama.cpp (CPU only) from the sources vendored in the PyPI sdist of llama-cpp-python, for the engine
# step of validation (trainer/validation/engines.py) and bench/engines.py. Never part of `make run`/`make test`.
#
# Only the binaries the engine step runs are built: llama-server (the engine users serve with: greedy
# decoding with `--spec-type draft-dflash` or `ngram-simple`, token ids in and out) and
# llama-speculative-simple (the example the llama.cpp docs give for DFlash). -j2: this machine has 2 cores.
#
# Usage: bench/setup/llama_cpp.sh [DEST]      (default <repo>/.engines/llama.cpp; binaries in DEST/bin)
# The code finds the binaries through $DRAFTSMITH_LLAMA_CPP_BIN, else <repo>/.engines/llama.cpp/bin
# (trainer/validation/engine_paths.py). PYTHON selects the pip that downloads the sdist. Takes ~20-30 min.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$repo/.engines/llama.cpp}
python=${PYTHON:-$repo/.venv/bin/python}
version=0.3.36
jobs=${JOBS:-2}
targets=(llama-server llama-speculative-simple)

if [[ -x "$dest/bin/llama-server" && -x "$dest/bin/llama-speculative-simple" ]]; then
    echo "llama.cpp (llama-cpp-python ${version}) already built in $dest/bin"
    exit 0
fi

mkdir -p "$dest"
if [[ ! -f "$dest/src/CMakeLists.txt" ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==${version}" -d "$work"
    tar -xzf "$work/llama_cpp_python-${version}.tar.gz" -C "$work" "llama_cpp_python-${version}/vendor/llama.cpp"
    rm -rf "$dest/src"
    mv "$work/llama_cpp_python-${version}/vendor/llama.cpp" "$dest/src"
fi

# No network at build time: no prebuilt web UI (it would be fetched), no HTTPS client, no tests.
cmake -S "$dest/src" -B "$dest/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
nice cmake --build "$dest/build" -j "$jobs" --target "${targets[@]}"

mkdir -p "$dest/bin"
for t in "${targets[@]}"; do
    cp "$dest/build/bin/$t" "$dest/bin/$t.tmp" && mv "$dest/bin/$t.tmp" "$dest/bin/$t"
done
echo "llama.cpp (llama-cpp-python ${version}) built in $dest/bin: ${targets[*]}"
