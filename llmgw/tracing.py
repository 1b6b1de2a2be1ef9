"""The one way llmgw's processes make an OpenTelemetry tracer provider, and carry a trace across the wire.

Every part that traces (the control plane, the agent, the gateway) is off by default and imports nothing of
OpenTelemetry then: `open_provider` is only called with an endpoint. On, spans are exported to an OTLP/HTTP
collector (`opentelemetry-exporter-otlp-proto-http`, POST `<endpoint>/v1/traces`) by the SDK's batch processor
thread; the event loop only records them.

A trace crosses a process boundary as a W3C Trace Context `traceparent` header value
("00-<32 hex trace id>-<16 hex span id>-<2 hex flags>", https://www.w3.org/TR/trace-context/#traceparent-header),
written and read with OpenTelemetry's `TraceContextTextMapPropagator`.
"""

from __future__ import annotations

from typing import Any


def open_provider(endpoint: str, service_name: str, *, sample_ratio: float = 1.0,
                  schedule_delay_seconds: float = 5.0) -> Any:
    """An opentelemetry-sdk TracerProvider exporting to the OTLP/HTTP collector at `endpoint` ("http://host:4318").

    `service_name`: the resource's `service.name`. `sample_ratio` (0..1): the share of new traces recorded
    (`ParentBased(TraceIdRatioBased)`: a span whose parent came sampled over the wire follows its parent).
    `schedule_delay_seconds`: the longest a finished span waits before it is sent. Call `.shutdown()` to flush.
    Raises: ValueError when `sample_ratio` is outside 0..1.
    """
    if not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"the trace sampling ratio must be between 0 and 1, not {sample_ratio}")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                              sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_seconds * 1000))
    return provider


def traceparent_of(span: Any) -> str:
    """The W3C `traceparent` value naming `span` (an OpenTelemetry span) as the parent; "" when the span is not
    recording a valid trace."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def context_from_traceparent(traceparent: str) -> Any:
    """An OpenTelemetry Context whose current span is the remote parent `traceparent` names; an empty Context
    (a new trace) when the value is empty or malformed (the propagator ignores what it cannot parse)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent} if traceparent else {})
