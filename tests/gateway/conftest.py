"""Fixtures for gateway tests: a real SQLite store (helpers are in gateway_harness.py).

Everything runs on 127.0.0.1 with port 0. The official `openai` SDK is the client.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from llmgw.store import open_store


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
