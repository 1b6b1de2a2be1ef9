"""Traces of the control plane, received by a small OTLP/HTTP collector in the test that decodes the real OTLP
protobufs (opentelemetry-proto): the pass that places a replica is a trace, and the replica's start is a span
under it that ends when its node reports the shard ready. Off by default."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from llmgw.control import ControlConfig, ControlPlane

from .observed_fleet import observed_fleet


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[tuple[dict, Span]]]]:
    """An OTLP/HTTP trace receiver on loopback: yields (endpoint, spans), each span with its resource's
    attributes, appended as the exporter POSTs them to /v1/traces."""
    spans: list[tuple[dict, Span]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            assert self.path == "/v1/traces", self.path
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    spans.extend((resource, span) for span in scope_spans.spans)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans
    finally:
        server.shutdown()
        server.server_close()


def attributes(span: Span) -> dict:
    out = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = getattr(value, value.WhichOneof("value"))
    return out


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
