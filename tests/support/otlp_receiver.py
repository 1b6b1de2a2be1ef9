"""A small OTLP/HTTP trace receiver for the tests: it decodes the real OTLP protobufs (opentelemetry-proto) the
SDK's exporter POSTs to /v1/traces."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


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
