"""Traces of the control plane, received by a small OTLP/HTTP collector in the test that decodes the real OTLP
protobufs (opentelemetry-proto): the pass that places a replica is a trace, and the replica's start is a span
under it that ends when its node reports the shard ready. Off by default."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from llmgw.control import ControlConfig, ControlPlane

from .observed_fleet import observed_fleet
from .process_fleet import server_and_agent
from .test_fleet_end_to_end import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from otlp_receiver import attributes, otlp_receiver  # noqa: E402


async def test_a_replica_start_is_a_span_from_its_placing_pass_until_the_node_reports_it_ready(
    tmp_path, weights_mirror, fake_engine,
):
    with otlp_receiver() as (endpoint, spans):
        async with observed_fleet(tmp_path, weights_mirror, fake_engine, otlp_endpoint=endpoint) as plane:
            commit = plane.snapshot().settings.commit
        # the plane flushed its spans as it stopped
        starts = [s for _, s in spans if s.name == "replica start" and attributes(s)["llmgw.replica"] == "tiny-0"]
        assert len(starts) == 1, [s.name for _, s in spans]
        (start,) = starts
        passes = {s.span_id: s for _, s in spans if s.name == "reconcile pass"}
        placing = passes[start.parent_span_id]
        assert placing.trace_id == start.trace_id
        assert attributes(placing)["llmgw.settings.commit"] == commit
        assert attributes(placing)["llmgw.pass.actions_sent"] >= 1
        found = attributes(start)
        assert found["llmgw.node"] == "n1" and found["llmgw.model"] == "tiny" and found["llmgw.action"] == "start"
        assert found["llmgw.shard.state"] == "ready"
        assert start.status.code == Status.STATUS_CODE_OK
        assert [e.name for e in start.events][-1] == "ready"
        assert start.end_time_unix_nano > start.start_time_unix_nano >= placing.start_time_unix_nano
        assert {resource["service.name"] for resource, _ in spans} == {"llmgw-control-plane"}


def test_tracing_is_off_unless_an_endpoint_is_given(tmp_path):
    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "none.git"), state_dir=tmp_path / "state"))
    assert plane.tracing is None


@pytest.mark.slow
def test_a_replica_start_continues_on_the_node_in_one_trace_across_processes(tmp_path, weights_mirror, fake_engine):
    """`llmgw server` and `llmgw agent` as separate processes, both pointed at the receiver: the agent's spans of
    the start (weights fetch, engine launch, ready wait) are children of the control plane's "replica start"."""
    with otlp_receiver() as (endpoint, spans):
        with server_and_agent(tmp_path, weights_mirror, fake_engine, server_args=("--otlp-endpoint", endpoint),
                              agent_args=("--otlp-endpoint", endpoint)):
            # both export finished spans within 5 s (their batch processors' delay)
            wanted = {"replica start", "shard start", "weights fetch", "engine launch", "engine ready wait"}
            wait_for(lambda: wanted <= {s.name for _, s in spans}, 30, "the spans of both processes",
                     lambda: sorted(s.name for _, s in spans))
        by_name: dict[str, list] = {}
        for resource, span in spans:
            by_name.setdefault(span.name, []).append((resource, span))
    (start,) = [s for _, s in by_name["replica start"] if attributes(s)["llmgw.replica"] == "tiny-0"]
    (agent_resource, shard_start), = by_name["shard start"]
    assert agent_resource["service.name"] == "llmgw-agent"
    assert shard_start.trace_id == start.trace_id and shard_start.parent_span_id == start.span_id
    assert attributes(shard_start)["llmgw.node"] == "n1" and attributes(shard_start)["llmgw.shard"] == "tiny-0/0"
    assert shard_start.status.code == Status.STATUS_CODE_OK
    steps = {}
    for name in ("weights fetch", "engine launch", "engine ready wait"):
        (_, step), = by_name[name]
        assert step.trace_id == start.trace_id and step.parent_span_id == shard_start.span_id, name
        assert step.status.code == Status.STATUS_CODE_OK, (name, step.status.message)
        steps[name] = step
    assert attributes(steps["weights fetch"])["llmgw.weights.files"] == 1
    # in order, on the node, inside the control plane's span
    assert (start.start_time_unix_nano <= steps["weights fetch"].start_time_unix_nano
            <= steps["engine launch"].start_time_unix_nano <= steps["engine ready wait"].start_time_unix_nano
            < steps["engine ready wait"].end_time_unix_nano <= shard_start.end_time_unix_nano)
