"""Fixtures for gateway tests: a real SQLite store (helpers are in gateway_harness.py).

Everything runs on 127.0.0.1 with port 0. The official `openai` SDK is the client.
"""

from __future__ import annotations

import pytest

from llmgw.store import open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store.db")
    yield s
    s.close()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The real vLLM, started once per test run for every test that needs it (`vllm_harness`); yields `Served`."""
    from vllm_harness import run_vllm

    yield from run_vllm(tmp_path_factory.mktemp("vllm"))
