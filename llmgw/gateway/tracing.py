"""OpenTelemetry spans of the gateway's requests: one span per sampled request, from its arrival to its settlement.

Off by default and cheap when off: `open_gateway_tracing` returns None unless an OTLP endpoint *and* a sampling
ratio above 0 are given, and the gateway then calls nothing here. On, `begin` asks the sampler once per request
(`ParentBased(TraceIdRatioBased(ratio))`: a request carrying a sampled W3C `traceparent` header is traced as part
of its caller's trace); an unsampled request gets None and costs nothing more. Nothing is done per streamed chunk:
the time of the first token is the relay's own `ttft_seconds`, turned into an event's timestamp at settlement.

Span (kind SERVER), named "{gen_ai.operation.name} {gen_ai.request.model}" as the OpenTelemetry semantic
conventions for generative AI spans say (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/,
attribute names as in opentelemetry-semantic-conventions 0.66b2, `gen_ai_attributes`):
- `gen_ai.operation.name` ("chat", "text_completion", "embeddings"), `gen_ai.request.model` (the catalog name
  the request resolved to, or "(unknown)": never a client's free text), `gen_ai.request.max_tokens`,
  `gen_ai.request.temperature`, `gen_ai.request.stream`... when the client sent them;
- at settlement `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `http.response.status_code`,
  `error.type` (the status, for 400 and above), `server.address`/`server.port` of the replica;
- llmgw's own: `llmgw.request_id` (the gateway's own id), `llmgw.client_request_id` (the client's
  `x-request-id`, when it sent one the gateway kept), `llmgw.project`, `llmgw.replica`, `llmgw.node`,
  `llmgw.usage.cached_tokens`, `llmgw.ttft_seconds`.
Events: "admitted" (quota reserved, or no quota), "upstream response" (the engine's response head arrived: the
routing choice, with `llmgw.replica`, `llmgw.node`), "first token" (its time), and the span ends when the request
is settled (the stream's end, or the refusal).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from llmgw.tracing import context_from_traceparent, open_provider

TRACER_NAME = "llmgw.gateway"

OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion", "/v1/embeddings": "embeddings"}
# request fields copied as gen_ai.request.<field> when the client sent a number (or a bool) there
_REQUEST_FIELDS = {"max_tokens": "gen_ai.request.max_tokens", "max_completion_tokens": "gen_ai.request.max_tokens",
                   "temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p",
                   "seed": "gen_ai.request.seed", "frequency_penalty": "gen_ai.request.frequency_penalty",
                   "presence_penalty": "gen_ai.request.presence_penalty", "stream": "gen_ai.request.stream"}


def open_gateway_tracing(endpoint: str | None, sample_ratio: float, *,
                         schedule_delay_seconds: float = 5.0) -> GatewayTracing | None:
    """A `GatewayTracing` sampling `sample_ratio` (0..1) of the requests to the OTLP/HTTP collector at `endpoint`,
    or None when there is no endpoint or the ratio is 0 (off: nothing of OpenTelemetry is imported).
    Raises: ValueError when the ratio is outside 0..1."""
    if not endpoint or sample_ratio <= 0:
        return None
    return GatewayTracing(open_provider(endpoint, "llmgw-gateway", sample_ratio=sample_ratio,
                                        schedule_delay_seconds=schedule_delay_seconds))


class GatewayTracing:
    """Opens a `RequestTrace` per sampled request with `provider` (an opentelemetry-sdk TracerProvider).
    `shutdown()` sends what is buffered (blocks up to the exporter's timeout: call it from a thread)."""

    def __init__(self, provider: Any):
        from opentelemetry.trace import SpanKind

        self.provider = provider
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._kind = SpanKind.SERVER

    def begin(self, path: str, request_id: str, traceparent: bytes | None,
              client_request_id: str | None = None) -> RequestTrace | None:
        """The trace of a request to `path` with the gateway's id `request_id` (and the client's own
        `client_request_id`, when it sent one), continuing the client's `traceparent` header (raw bytes; None: a
        new trace); None when the sampler leaves it out."""
        operation = OPERATIONS.get(path, "chat")
        context = context_from_traceparent(traceparent.decode("latin-1")) if traceparent else None
        attributes = {"gen_ai.operation.name": operation, "llmgw.request_id": request_id}
        if client_request_id is not None:
            attributes["llmgw.client_request_id"] = client_request_id
        span = self._tracer.start_span(operation, context=context, kind=self._kind, attributes=attributes)
        if not span.is_recording():
            return None
        return RequestTrace(span, operation)

    def shutdown(self) -> None:
        self.provider.shutdown()


class RequestTrace:
    """The span of one request. Its methods are called at most once each, in this order; `end` may come at any
    point (a refusal) and later calls then do nothing."""

    def __init__(self, span: Any, operation: str):
        self.span = span
        self.operation = operation
        self.started_ns = time.time_ns()
        self.started_perf = time.perf_counter()
        self._ended = False

    @property
    def trace_id(self) -> str:
        """The span's trace id, 32 hex digits."""
        return format(self.span.get_span_context().trace_id, "032x")

    def request(self, model: str, body: dict, project: str) -> None:
        """The resolved catalog `model` (renames the span), the client's sampling fields of `body`, `project`."""
        self.span.update_name(f"{self.operation} {model}")
        attributes: dict[str, Any] = {"gen_ai.request.model": model, "llmgw.project": project}
        for field, name in _REQUEST_FIELDS.items():
            value = body.get(field)
            if isinstance(value, (bool, int, float)) and name not in attributes:
                attributes[name] = value
        self.span.set_attributes(attributes)

    def admitted(self, quota: bool) -> None:
        self.span.add_event("admitted", {"llmgw.quota": quota})

    def responded(self, replica: Any) -> None:
        """The engine's response head arrived from `replica` (an `llmgw.routes.ReplicaRoute`)."""
        url = urlsplit(replica.base_url)
        attributes = {"llmgw.replica": replica.replica_id, "llmgw.node": replica.node_id or "",
                      "server.address": url.hostname or "", "server.port": url.port or 0}
        self.span.set_attributes(attributes)
        self.span.add_event("upstream response", {"llmgw.replica": replica.replica_id,
                                                  "llmgw.node": replica.node_id or ""})

    def end(self, status: int, record: Any = None) -> None:
        """End the span: HTTP `status`, and from `record` (an `llmgw.store.UsageRecord`, None for a request
        refused before it had one) the tokens and the time to first token."""
        if self._ended:
            return
        self._ended = True
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if record is not None:
            attributes.update({"gen_ai.usage.input_tokens": record.prompt_tokens,
                               "gen_ai.usage.output_tokens": record.completion_tokens,
                               "llmgw.usage.cached_tokens": record.cached_tokens})
            if record.ttft_seconds is not None:
                attributes["llmgw.ttft_seconds"] = record.ttft_seconds
                span.add_event("first token", timestamp=self.started_ns + int(record.ttft_seconds * 1e9))
        if status >= 400:
            attributes["error.type"] = str(status)
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.set_attributes(attributes)
        span.end()
