"""OpenTelemetry traces of the control plane: a reconcile pass that sends something is a trace, and each replica
start it sends is a span under it, from placement until its node reports the shard ready (or failed).

Off by default and free when off: `open_tracing(endpoint)` returns None when no OTLP endpoint is given, and the
control plane then calls nothing here. On, spans go to an OTLP/HTTP collector (`opentelemetry-exporter-otlp-proto-
http`) from the SDK's batch processor thread; the event loop only records them.

    tracing = open_tracing("http://collector:4318")     # or a TracerProvider of your own, see `StartTracing`
    tracing.after_pass(decision, state)                  # the pass's span, with a span per START/RESTART sent
    tracing.on_change(old, new)                          # a shard's state moves: an event, or the span ends

What is traced (span names and attributes):
- "reconcile pass": `llmgw.pass.number`, `llmgw.pass.trigger`, `llmgw.settings.commit`, `llmgw.pass.converged`,
  `llmgw.pass.actions_sent`; one event per replica the pass could not place ("unplaced", with its reasons). It
  ends when the pass has been decided.
- "replica start" (child of its pass): `llmgw.node`, `llmgw.model`, `llmgw.replica`, `llmgw.shard`,
  `llmgw.action` (start or restart), `llmgw.reason`; an event per shard state the node reports on the way
  ("fetching", "starting", ...), and `llmgw.shard.state` at the end. Status OK when ready, ERROR when the shard
  failed (with its error), when the command failed, or when a later pass no longer plans it.

The StartShard sent for a traced start carries the span's W3C `traceparent` (`traceparent(node, shard)`), so
the agent's spans (llmgw.agent.tracing: weights fetch, engine launch, readiness) are its children. An
InstallEngine carries the `traceparent` of the pass that sent it (`install_traceparent(node, engine)`): the
agent's "engine install" span is a child of that pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgw.control.deciding import Decision, action_key
from llmgw.control.state import ControlState
from llmgw.identity import ShardState
from llmgw.plan.types import ActionKind
from llmgw.tracing import open_provider, traceparent_of

TRACER_NAME = "llmgw.control"


@dataclass
class _Open:
    span: Any
    node_id: str
    shard_id: str
    last_state: str = ""


def open_tracing(endpoint: str | None, *, sample_ratio: float = 1.0, service_name: str = "llmgw-control-plane",
                 schedule_delay_seconds: float = 5.0) -> StartTracing | None:
    """A `StartTracing` exporting to the OTLP/HTTP collector at `endpoint` ("http://host:4318"; spans are POSTed
    to `<endpoint>/v1/traces`), or None when `endpoint` is None or empty (tracing off; nothing is imported).
    `sample_ratio` (0..1): the share of reconcile passes recorded (with the starts and installs under them).
    `schedule_delay_seconds`: the longest a finished span waits before it is sent.
    Raises: ValueError when `sample_ratio` is outside 0..1."""
    if not endpoint:
        return None
    return StartTracing(open_provider(endpoint, service_name, sample_ratio=sample_ratio,
                                      schedule_delay_seconds=schedule_delay_seconds))


class StartTracing:
    """Records the spans above with `provider` (an opentelemetry-sdk TracerProvider). Not thread-safe: call it
    from the control loop's hooks only. `shutdown()` flushes and stops the provider."""

    def __init__(self, provider: Any):
        self.provider = provider
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._open: dict[tuple[str, str], _Open] = {}
        self._installs: dict[tuple[str, str], str] = {}  # (node, engine key) -> traceparent of the sending pass

    def after_pass(self, decision: Decision, state: ControlState) -> None:
        """Record a pass that sent actions or left replicas unplaced, with a "replica start" span per START or
        RESTART it sent; spans of starts no longer planned end with an error."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        record = decision.record
        planned = {action_key(a)[1:] for a in decision.plan.actions
                   if a.kind in (ActionKind.START, ActionKind.RESTART, ActionKind.KEEP)}
        for key in [k for k in self._open if k not in planned]:
            opened = self._open.pop(key)
            if opened.last_state != ShardState.READY.value:
                opened.span.set_status(Status(StatusCode.ERROR, "no longer planned"))
            opened.span.end()
        if not decision.send and not record.unplaced:
            return
        attributes = {"llmgw.pass.number": record.number, "llmgw.pass.trigger": record.trigger,
                      "llmgw.settings.commit": record.settings_commit or "", "llmgw.pass.converged": record.converged,
                      "llmgw.pass.actions_sent": len(decision.send)}
        with self._tracer.start_as_current_span("reconcile pass", attributes=attributes) as pass_span:
            for unplaced in record.unplaced:
                pass_span.add_event("unplaced", {"llmgw.replica": unplaced.replica_id, "llmgw.model": unplaced.model,
                                                 "llmgw.reasons": [f"{n}: {r}" for n, r in unplaced.reasons]})
            context = trace.set_span_in_context(pass_span)
            for action in decision.send:
                if action.kind is ActionKind.INSTALL:
                    self._installs[action_key(action)[1:]] = traceparent_of(pass_span)
                    continue
                if action.kind not in (ActionKind.START, ActionKind.RESTART):
                    continue
                _kind, node_id, shard_id = action_key(action)
                previous = self._open.pop((node_id, shard_id), None)
                if previous is not None:
                    previous.span.set_status(Status(StatusCode.ERROR, "started again"))
                    previous.span.end()
                span = self._tracer.start_span("replica start", context=context, attributes={
                    "llmgw.node": node_id, "llmgw.model": action.model, "llmgw.replica": action.replica_id,
                    "llmgw.shard": shard_id, "llmgw.action": action.kind.value, "llmgw.reason": action.reason,
                })
                self._open[(node_id, shard_id)] = _Open(span, node_id, shard_id)

    def traceparent(self, node_id: str, shard_id: str) -> str:
        """The W3C `traceparent` of the open "replica start" span of `shard_id` on `node_id`, for its StartShard;
        "" when none is open (the start was not sent by a traced pass)."""
        opened = self._open.get((node_id, shard_id))
        return traceparent_of(opened.span) if opened is not None else ""

    def install_traceparent(self, node_id: str, engine: str) -> str:
        """The W3C `traceparent` of the reconcile pass that sent the install of `engine` ("llama.cpp@b11434") to
        `node_id`, for its InstallEngine (the agent's "engine install" span is its child); "" when no traced pass
        sent it. Each is given once."""
        return self._installs.pop((node_id, engine), "")

    def on_change(self, old: ControlState, new: ControlState) -> None:
        """Follow the open starts through the fleet of `new`: an event per shard state reported, the span's end
        when ready or failed, an error when the command failed."""
        if not self._open or new.fleet is old.fleet and new.failures is old.failures:
            return
        from opentelemetry.trace import Status, StatusCode

        for key, opened in list(self._open.items()):
            failure = new.failures.get(("start", *key))
            if failure is not None:
                opened.span.set_status(Status(StatusCode.ERROR, failure.error))
                self._close(key, "command failed")
                continue
            record = new.fleet.get(opened.node_id)
            shard = next((s for s in record.state.shards if s.shard_id == opened.shard_id), None) if record else None
            if shard is None or shard.state.value == opened.last_state:
                continue
            opened.last_state = shard.state.value
            opened.span.add_event(shard.state.value)
            if shard.state is ShardState.READY:
                opened.span.set_status(Status(StatusCode.OK))
                self._close(key, shard.state.value)
            elif shard.state is ShardState.FAILED:
                opened.span.set_status(Status(StatusCode.ERROR, shard.error or "the shard failed"))
                self._close(key, shard.state.value)

    def _close(self, key: tuple[str, str], state: str) -> None:
        opened = self._open.pop(key)
        opened.span.set_attribute("llmgw.shard.state", state)
        opened.span.end()

    def shutdown(self) -> None:
        """End the open spans, send what is buffered and stop the provider (blocks up to the exporter's timeout)."""
        for key in list(self._open):
            self._close(key, "control plane stopped")
        self.provider.shutdown()
