"""Fixtures for gateway tests: a real SQLite store, the run's one real vLLM and the run's shared llama-servers
(tests/support/shared_engines.py); helpers are in gateway_harness.py.

Everything runs on 127.0.0.1 with port 0. The official `openai` SDK is the client.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from llmgw.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store.db")
    yield s
    s.close()


@pytest.fixture
def vllm_server(vllm_slot, tmp_path_factory):
    """The real vLLM (`vllm_harness`), started once per test run for every test that needs it and kept in the run's
    one vLLM slot (tests/support/vllm_slot.py) until another holder takes it or the run ends; its `Served`."""
    from vllm_harness import run_vllm

    return vllm_slot.take("vllm_server", lambda: contextmanager(run_vllm)(tmp_path_factory.mktemp("vllm")))


@pytest.fixture(scope="session")
def shared_gemma(llama_server_binary, gemma_gguf, tmp_path_factory):
    """The run's shared llama-server serving Gemma 3 270M (tests/support/shared_engines.py: its flags, and what a
    module may do with it); its `ServingEngine` (base URL, served name, key)."""
    from shared_engines import shared_engine

    with shared_engine("shared_gemma", llama_server_binary, gemma_gguf,
                       tmp_path_factory.mktemp("shared-gemma") / "server.log") as engine:
        yield engine


@pytest.fixture(scope="session")
def shared_smollm2(llama_server_binary, smollm2_gguf, tmp_path_factory):
    """The run's shared llama-server serving SmolLM2 135M Instruct with its chat template (jinja), as
    `shared_gemma`."""
    from shared_engines import shared_engine

    with shared_engine("shared_smollm2", llama_server_binary, smollm2_gguf,
                       tmp_path_factory.mktemp("shared-smollm2") / "server.log") as engine:
        yield engine
