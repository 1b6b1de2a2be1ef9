"""The agent traces an engine install under the trace context its InstallEngine carries, to the collector its
AgentSettings name (agents/ `tracing:`), received by the OTLP/HTTP receiver of the test suite (real protobufs)."""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from llmgw.agent import AgentConfig, run_agent
from llmgw.tracing import open_provider, traceparent_of
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching
from test_install_refusals import _install, _server_at

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from otlp_receiver import attributes, otlp_receiver  # noqa: E402


def _result(command_id: str):
    return lambda m: m.WhichOneof("body") == "command_result" and m.command_result.command_id == command_id


async def _configure(link, command_id: str, tracing: pb.TraceSettings) -> None:
    await link.send(control_message(command_id=command_id, agent_settings=pb.AgentSettings(tracing=tracing)))
    assert (await next_matching(link, _result(command_id))).command_result.ok


async def test_an_install_is_a_span_under_the_trace_its_command_carries_sent_where_the_settings_say(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "mirror"
    _server_at(mirror / "llama.cpp" / "b1")
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                         cache_dir=tmp_path / "cache")
    with otlp_receiver() as (endpoint, spans):
        parents = open_provider(endpoint, "test-control-plane")
        parent = parents.get_tracer("test").start_span("reconcile pass")
        control = ControlSide()
        async with trio.open_nursery() as nursery:
            await nursery.start(run_agent, config, control.connect)
            link = await control.links.receive()
            await link.receive()  # register
            await _configure(link, "s1", pb.TraceSettings(endpoint=endpoint, sample_ratio=1.0))
            await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
                engine="llama.cpp", version="b1", mirror=str(mirror), traceparent=traceparent_of(parent))))
            assert (await next_matching(link, _result("i1"))).command_result.ok
            # no trace context: a trace of the node's own; a refused version: status ERROR with the reason
            assert not (await _install(link, "i2", "..", mirror)).ok
            nursery.cancel_scope.cancel()  # the agent sends what it buffered as it stops
        parent.end()
        parents.shutdown()
    installs = {attributes(s)["llmgw.engine"]: (resource, s) for resource, s in spans if s.name == "engine install"}
    assert set(installs) == {"llama.cpp@b1", "llama.cpp@.."}, [s.name for _, s in spans]
    resource, good = installs["llama.cpp@b1"]
    assert resource["service.name"] == "llmgw-agent"
    context = parent.get_span_context()
    assert good.trace_id == context.trace_id.to_bytes(16, "big")
    assert good.parent_span_id == context.span_id.to_bytes(8, "big")
    assert attributes(good) == {"llmgw.node": "n", "llmgw.engine": "llama.cpp@b1", "llmgw.engine.sources": "mirror"}
    assert good.status.code == Status.STATUS_CODE_OK
    _, bad = installs["llama.cpp@.."]
    assert bad.trace_id != good.trace_id and not bad.parent_span_id
    assert bad.status.code == Status.STATUS_CODE_ERROR
    assert "refusing to install llama.cpp version '..'" in bad.status.message


async def test_settings_without_an_endpoint_turn_the_agents_tracing_off_and_the_command_line_overrides_them(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "mirror"
    for version in ("b1", "b2", "b3"):
        _server_at(mirror / "llama.cpp" / version)
    with otlp_receiver() as (settings_endpoint, from_settings), otlp_receiver() as (cli_endpoint, from_cli):
        control = ControlSide()
        config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                             cache_dir=tmp_path / "cache")
        async with trio.open_nursery() as nursery:
            agent = await nursery.start(run_agent, config, control.connect)
            link = await control.links.receive()
            await link.receive()  # register
            await _configure(link, "s1", pb.TraceSettings(endpoint=settings_endpoint, sample_ratio=1.0))
            assert (await _install(link, "i1", "b1", mirror)).ok
            await _configure(link, "s2", pb.TraceSettings())  # tracing: removed from agents/
            assert agent.tracing is None
            assert (await _install(link, "i2", "b2", mirror)).ok
            nursery.cancel_scope.cancel()
        # started again with --otlp-endpoint: the saved settings name another collector, the command line wins
        config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                             cache_dir=tmp_path / "cache", otlp_endpoint=cli_endpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(run_agent, config, control.connect)
            link = await control.links.receive()
            await link.receive()
            await _configure(link, "s3", pb.TraceSettings(endpoint=settings_endpoint, sample_ratio=1.0))
            assert (await _install(link, "i3", "b3", mirror)).ok
            nursery.cancel_scope.cancel()
    # the first agent's provider was stopped (and sent its span) when the settings turned tracing off
    assert [attributes(s)["llmgw.engine"] for _, s in from_settings] == ["llama.cpp@b1"]
    assert [attributes(s)["llmgw.engine"] for _, s in from_cli] == ["llama.cpp@b3"]
