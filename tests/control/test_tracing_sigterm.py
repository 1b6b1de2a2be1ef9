"""`llmgw server` stopped with SIGTERM sends the spans it still buffers: a span ended just before the signal reaches
the collector (the OTLP/HTTP receiver of the test suite, decoding the real protobufs) before the process exits."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from llmgw.settings import init_repository
from support.llmgw_processes import LlmgwProcesses

from .conftest import write_seed
from .process_fleet import spawn_server
from .test_fleet_end_to_end import wait_for
from .test_tracing_settings import CHAT, cluster_tracing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from otlp_receiver import attributes, otlp_receiver  # noqa: E402


def test_a_span_ended_just_before_sigterm_reaches_the_collector(tmp_path):
    """The gateway's spans of requests answered a moment before SIGTERM, and the control plane's span of its first
    pass, are sent as the server stops, not lost with the batch processors' buffers (each waits up to 5 s for its
    next export)."""
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    with otlp_receiver() as (endpoint, spans):
        seed = write_seed(tmp_path / "seed", "ab" * 32)
        with open(seed / "llmgw.yaml", "a") as file:
            file.write(cluster_tracing(endpoint))
        init_repository(repo, seed)
        procs = LlmgwProcesses(tmp_path)
        try:
            server, admin = spawn_server(procs, repo, state)
            gateway = wait_for(lambda: admin.get("/api/v1/status").json()["control_plane"]["gateway_url"], 60,
                               "the gateway")
            ids = [httpx.post(f"{gateway}/v1/chat/completions", json=CHAT).headers["x-request-id"]
                   for _ in range(3)]
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
        finally:
            procs.stop()
        received = [attributes(s).get("llmgw.request_id") for _, s in spans if s.name == "chat"]
        passes = [s for _, s in spans if s.name == "reconcile pass"]  # the control plane's own provider
    assert sorted(received) == sorted(ids), (tmp_path / "server.log").read_text()
    assert passes and "unplaced" in {e.name for e in passes[0].events}  # no node: tiny-0 could not be placed
