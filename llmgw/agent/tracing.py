"""OpenTelemetry traces of the agent's side of a replica start, continuing the control plane's trace.

The control plane's StartShard carries the W3C `traceparent` of its "replica start" span (llmgw.control.tracing);
the agent's spans are its children, so one trace runs from the pass that placed the replica down to the engine
answering its health check on the node. A StartShard without one (the control plane does not trace) starts a
trace of its own.

Off by default and free when off: `open_agent_tracing(None, ...)` returns None and `NodeAgent` then uses
`NO_TRACE`, whose steps do nothing and import nothing.

    tracing = open_agent_tracing(("http://collector:4318", 1.0), node_id="gpu-7")
    trace = tracing.begin(start_shard_message)
    with trace.step("weights fetch"): ...
    trace.end(error="")                      # OK; a non-empty error ends it with status ERROR

An InstallEngine carries the `traceparent` of the control plane's reconcile pass that sent it: the agent's
"engine install" span (`llmgw.node`, `llmgw.engine`, `llmgw.engine.sources`; ERROR with the reason when the
install failed) is its child.

The endpoint and sampling come from `llmgw agent --otlp-endpoint` or agents/ `tracing:` (AgentSettings): the
agent opens a new provider when they change (`NodeAgent.retrace`), and the old one sends what it holds.

Spans (names and attributes):
- "shard start" (child of the control plane's "replica start"): `llmgw.node`, `llmgw.shard`, `llmgw.replica`,
  `llmgw.model`, `llmgw.engine`, `llmgw.settings.commit`; ERROR with the reason when the start failed.
- under it "weights fetch" (`llmgw.weights.files`), "engine launch" (building the command line and spawning the
  process) and "engine ready wait" (from the spawn until the engine's health path answers 200). A step that
  raises, or ends with an error, has status ERROR and the error as its description.
Resource `service.name`: "llmgw-agent" (the node is the spans' `llmgw.node`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llmgw.identity import engine_key
from llmgw.tracing import context_from_traceparent, open_provider
from llmgw.wire import pb

TRACER_NAME = "llmgw.agent"


def open_agent_tracing(target: tuple[str, float] | None, node_id: str, *,
                       schedule_delay_seconds: float = 5.0) -> AgentTracing | None:
    """An `AgentTracing` for `target` = (endpoint, sample ratio), as `AgentConfig.trace_target` gives it: spans are
    exported to the OTLP/HTTP collector at the endpoint ("http://host:4318"); the ratio (0..1) is the share of
    the traces the agent begins itself (a command without `traceparent`) that are recorded, and a command
    carrying one follows its sampled flag. None when `target` is None or its endpoint empty (off; nothing of
    OpenTelemetry is imported). `schedule_delay_seconds`: the longest a finished span waits before it is sent.
    Raises: ValueError when the ratio is outside 0..1; ImportError without the `tracing` extra."""
    if not target or not target[0]:
        return None
    endpoint, sample_ratio = target
    provider = open_provider(endpoint, "llmgw-agent", sample_ratio=sample_ratio,
                             schedule_delay_seconds=schedule_delay_seconds)
    return AgentTracing(provider, node_id, (endpoint, sample_ratio))


class AgentTracing:
    """Makes a `ShardTrace` per StartShard with `provider` (an opentelemetry-sdk TracerProvider). `shutdown()`
    sends what is buffered (blocks up to the exporter's timeout: call it from a thread)."""

    def __init__(self, provider: Any, node_id: str, target: tuple[str, float] | None = None):
        self.provider = provider
        self.node_id = node_id
        self.target = target  # (endpoint, sample ratio) it was opened for: `AgentConfig.trace_target`
        self._tracer = provider.get_tracer(TRACER_NAME)

    def begin(self, command: pb.StartShard) -> ShardTrace:
        """Open the "shard start" span of `command`, a child of its `traceparent` (a new trace when empty)."""
        span = self._tracer.start_span("shard start", context=context_from_traceparent(command.traceparent),
                                       attributes={
            "llmgw.node": self.node_id, "llmgw.shard": command.shard_id, "llmgw.replica": command.replica_id,
            "llmgw.model": command.model, "llmgw.engine": engine_key(command.engine, command.engine_version),
            "llmgw.settings.commit": command.settings_commit,
        })
        return ShardTrace(self._tracer, span)

    def begin_install(self, command: pb.InstallEngine) -> ShardTrace:
        """Open the "engine install" span of `command`, a child of its `traceparent` (the control plane's pass
        that sent it; a new trace when empty). End it with `end(error)`."""
        span = self._tracer.start_span("engine install", context=context_from_traceparent(command.traceparent),
                                       attributes={
            "llmgw.node": self.node_id, "llmgw.engine": engine_key(command.engine, command.version),
            "llmgw.engine.sources": _install_sources(command),
        })
        return ShardTrace(self._tracer, span)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _install_sources(command: pb.InstallEngine) -> str:
    """What an InstallEngine offers to install from, in the order llama.cpp's installer tries them
    (`llmgw.engines.llamacpp.install`): e.g. "mirror, archive, sdist"; "python packages" for a Python engine."""
    offered = (("mirror", command.mirror), ("archive", command.archive_url),
               ("sdist", command.sdist_package or command.sdist_version),
               ("python packages", list(command.python_packages)))
    return ", ".join(name for name, given in offered if given)


class ShardTrace:
    """The spans of one shard's start (or of one engine install): `step(name)` around each stage, `end(error)`
    once."""

    def __init__(self, tracer: Any, span: Any):
        self._tracer = tracer
        self._span = span
        self._ended = False

    @contextmanager
    def step(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span around the block; yields a `fail(error)` callable that ends the step with status ERROR.
        An exception (cancellation included) escaping the block ends it with ERROR and is re-raised."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        span = self._tracer.start_span(name, context=trace.set_span_in_context(self._span),
                                       attributes={f"llmgw.{k.replace('_', '.')}": v for k, v in attributes.items()})
        failed: list[str] = []
        try:
            yield failed.append
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
            span.end()
            raise
        span.set_status(Status(StatusCode.ERROR, failed[0]) if failed else Status(StatusCode.OK))
        span.end()

    def end(self, error: str = "") -> None:
        """End "shard start": OK, or ERROR with `error`. Later calls do nothing."""
        if self._ended:
            return
        from opentelemetry.trace import Status, StatusCode

        self._ended = True
        self._span.set_status(Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK))
        self._span.end()


class _NoTrace:
    """What `NodeAgent` uses when tracing is off: every step is a no-op."""

    @contextmanager
    def step(self, name: str, **attributes: Any) -> Iterator[Any]:
        yield lambda error: None

    def end(self, error: str = "") -> None:
        pass


NO_TRACE: Any = _NoTrace()
