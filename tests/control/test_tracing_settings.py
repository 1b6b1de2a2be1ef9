"""Tracing turned on by the settings repository (llmgw.yaml and agents/ `tracing:`), not the command line, for real
`llmgw server` and `llmgw agent` processes. Received by the OTLP/HTTP receiver of the test suite, which decodes the
real protobufs."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.control import ControlConfig, ControlPlane

from .conftest import git
from .process_fleet import server_and_agent
from .test_fleet_end_to_end import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from otlp_receiver import attributes, otlp_receiver  # noqa: E402

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def cluster_tracing(endpoint: str) -> str:
    """llmgw.yaml's `tracing:` sending every trace, every request's too, to `endpoint`."""
    return f"tracing:\n  endpoint: {endpoint}\n  sample_requests: 1\n"


@pytest.mark.slow
def test_tracing_settings_in_the_repository_send_the_server_and_the_agents_spans(
    tmp_path, weights_mirror, fake_engine,
):
    """A fresh agent learns agents/ `tracing:` with its first AgentSettings, answered before the control plane
    sends it the first StartShard; a second replica, pushed later, is traced too."""
    with otlp_receiver() as (endpoint, spans):
        settings = {"llmgw.yaml": cluster_tracing(endpoint),
                    "agents/default.yaml": f"tracing:\n  endpoint: {endpoint}\n"}
        with server_and_agent(tmp_path, weights_mirror, fake_engine, settings=settings) as (admin, _state):
            gateway = admin.get("/api/v1/status").json()["control_plane"]["gateway_url"]
            answer = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT)  # no API key: 401, traced all the same
            assert answer.status_code == 401
            checkout = tmp_path / "checkout"
            git("clone", "-q", str(tmp_path / "settings.git"), str(checkout), cwd=tmp_path)
            model = checkout / "catalog" / "tiny.yaml"
            model.write_text(model.read_text().replace("replicas: 1\n", "replicas: 2\n"))
            git("commit", "-qam", "a second replica", cwd=checkout)
            git("push", "-q", "origin", "HEAD:main", cwd=checkout)
            wait_for(lambda: {"tiny-0", "tiny-1"} <= {attributes(s).get("llmgw.replica") for _, s in spans
                                            if s.name == "shard start"}, 60, "the agent's span of tiny-1's start",
                     lambda: sorted((s.name, attributes(s).get("llmgw.replica", "")) for _, s in spans))
    services = {span.name: resource["service.name"] for resource, span in spans}
    assert services["reconcile pass"] == services["replica start"] == "llmgw-control-plane"
    assert services["shard start"] == services["engine ready wait"] == "llmgw-agent"
    assert services["chat"] == "llmgw-gateway"
    for replica in ("tiny-0", "tiny-1"):
        (start,) = [s for _, s in spans if s.name == "replica start" and attributes(s)["llmgw.replica"] == replica]
        (shard,) = [s for _, s in spans if s.name == "shard start" and attributes(s)["llmgw.replica"] == replica]
        assert shard.trace_id == start.trace_id and shard.parent_span_id == start.span_id
    (request,) = [s for _, s in spans if s.name == "chat"]
    assert attributes(request)["http.response.status_code"] == 401
    assert attributes(request)["llmgw.request_id"] == answer.headers["x-request-id"]


async def test_a_control_plane_without_the_tracing_extra_serves_untraced_and_says_so(
    tmp_path, settings_repo, monkeypatch, caplog,
):
    """llmgw.yaml may turn tracing on for a control plane installed without `llmgw[tracing]`: it starts all the
    same, without spans, and logs what to install (the missing package is simulated by hiding the exporter)."""
    checkout = tmp_path / "checkout"
    git("clone", "-q", str(settings_repo), str(checkout), cwd=tmp_path)
    with open(checkout / "llmgw.yaml", "a") as file:
        file.write(cluster_tracing("http://127.0.0.1:9"))
    git("commit", "-qam", "tracing", cwd=checkout)
    git("push", "-q", "origin", "HEAD:main", cwd=checkout)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert plane.snapshot().settings.cluster.tracing.endpoint == "http://127.0.0.1:9"
        assert plane.tracing is None and plane.gateway.tracing is None
        nursery.cancel_scope.cancel()
    assert "install the tracing extra" in caplog.text
