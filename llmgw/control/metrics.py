"""GET /metrics on the admin listener: the fleet, the control plane and the gateway in one Prometheus scrape.

    collector = ControlCollector(plane.snapshot, trio.current_time)
    body = render_metrics(collector, gateway_registry)      # text exposition format, bytes

Everything but the gateway's counters is computed at scrape time from one `ControlState` (`plane.snapshot()`,
immutable): nothing here reads the plane's other attributes, and nothing is kept between scrapes. The gateway's
counters live in its own prometheus_client registry (llmgw.gateway.metrics) and are appended as they are.

Control-plane families (names in docs/observability.md): passes by outcome and their duration, actions by kind
and outcome (from `ControlState.tallies`), actions in flight and backing off, whether the last pass converged,
replicas left unplaced, the settings commit in force and a rejected branch head, leadership, agents connected;
the requests the gateway holds for a model scaled to zero (`llmgw.control.autoscaling`; the replicas an autoscaled
model wants are its `llmgw_model_replicas_desired`, llmgw.control.metrics_fleet).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily, Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llmgw.control.autoscaling import wanted_counts
from llmgw.control.metrics_fleet import fleet_families
from llmgw.control.state import ControlState
from llmgw.control.tallies import ACTION_OUTCOMES, PASS_OUTCOMES
from llmgw.plan.types import ActionKind

CONTENT_TYPE = CONTENT_TYPE_LATEST
METRICS_SCOPE = "metrics"
"""The token scope that may read /metrics (besides the admin token): see `AdminApp.authorised_for`."""

ACTION_KINDS = tuple(kind.value for kind in ActionKind if kind is not ActionKind.KEEP)


def control_families(state: ControlState) -> list[Metric]:
    """The control plane's own metric families from `state`. Every label value comes from a fixed enumeration,
    except the settings commit ids (one series each, the commit in force and a rejected head)."""
    tallies = state.tallies
    passes = CounterMetricFamily("llmgw_control_passes", "Reconcile passes by outcome (converged after the pass "
                                 "or not).", labels=["outcome"])
    for outcome in PASS_OUTCOMES:
        passes.add_metric([outcome], float(tallies.passes.get(outcome, 0)))
    duration = HistogramMetricFamily("llmgw_control_pass_duration_seconds", "Time spent deciding one reconcile "
                                     "pass (planning, not the commands it sends), seconds.")
    duration.add_metric([], [(_bound(bound), float(count)) for bound, count in tallies.cumulative_buckets()],
                        tallies.pass_seconds_sum)
    actions = CounterMetricFamily("llmgw_control_actions", "Actions by kind and outcome: sent by a pass, then "
                                  "succeeded or failed as the node answered.", labels=["kind", "outcome"])
    for kind in ACTION_KINDS:
        for outcome in ACTION_OUTCOMES:
            actions.add_metric([kind, outcome], float(tallies.actions.get((kind, outcome), 0)))
    in_flight = GaugeMetricFamily("llmgw_control_actions_in_flight", "Actions sent and not yet done, by kind.",
                                  labels=["kind"])
    backing_off = GaugeMetricFamily("llmgw_control_actions_backing_off", "Failed actions waiting to be retried, "
                                    "by kind (a restart counts as start).", labels=["kind"])
    flying = [flight.action.kind.value for flight in state.in_flight.values()]
    failing = [failure.kind for failure in state.failures.values()]
    for kind in ACTION_KINDS:
        in_flight.add_metric([kind], float(flying.count(kind)))
        if kind != ActionKind.RESTART.value:
            backing_off.add_metric([kind], float(failing.count(kind)))
    last = state.last_pass
    converged = GaugeMetricFamily("llmgw_control_converged", "1 when the last reconcile pass found the fleet "
                                  "converged to the settings in force, else 0.")
    converged.add_metric([], 1.0 if last is not None and last.converged else 0.0)
    unplaced = GaugeMetricFamily("llmgw_control_unplaced_replicas", "Replicas the last pass could not place.")
    unplaced.add_metric([], float(len(last.unplaced)) if last is not None else 0.0)
    last_at = GaugeMetricFamily("llmgw_control_last_pass_timestamp_seconds", "When the last pass ran, unix seconds.")
    if last is not None:
        last_at.add_metric([], last.started_at)
    return [passes, duration, actions, in_flight, backing_off, converged, unplaced, last_at,
            *_settings_families(state), *_leadership_families(state)]


def _bound(seconds: float) -> str:
    return "+Inf" if seconds == float("inf") else repr(seconds)


def _settings_families(state: ControlState) -> Iterator[Metric]:
    settings, watch = state.settings, state.watch
    commit = InfoMetricFamily("llmgw_settings", "The settings commit in force (absent before one validated).")
    if settings is not None:
        commit.add_metric([], {"commit": settings.commit or ""})
    yield commit
    rejected = watch.bad or watch.held
    flag = GaugeMetricFamily("llmgw_settings_head_rejected", "1 while the branch head is not in force (invalid, "
                             "or held back by the empty-catalog guard), else 0.")
    flag.add_metric([], 1.0 if rejected is not None else 0.0)
    yield flag
    info = InfoMetricFamily("llmgw_settings_rejected", "The rejected branch head and why (absent when none).")
    if rejected is not None:
        info.add_metric([], {"commit": rejected.commit, "reason": "invalid" if watch.bad else "empty_catalog"})
    yield info
    remote = GaugeMetricFamily("llmgw_settings_fetch_failing", "1 while fetching the settings repository fails.")
    remote.add_metric([], 1.0 if watch.remote_error else 0.0)
    yield remote


def _leadership_families(state: ControlState) -> Iterator[Metric]:
    leader = GaugeMetricFamily("llmgw_control_leader", "1 while this control plane holds the leader lease.")
    leader.add_metric([], 1.0 if state.leadership.leader else 0.0)
    yield leader
    agents = GaugeMetricFamily("llmgw_control_agents_connected", "Agents with a stream open to this control plane.")
    agents.add_metric([], float(sum(1 for r in state.fleet.records() if r.connected and not r.lost)))
    yield agents


class ControlCollector:
    """A prometheus_client custom collector over `snapshot()` (a `ControlState`) and `clock()` (control-plane
    seconds, the clock of `NodeReadings.at`): each `collect()` builds every family from one snapshot."""

    def __init__(self, snapshot: Callable[[], ControlState], clock: Callable[[], float]):
        self._snapshot = snapshot
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        state = self._snapshot()
        yield from control_families(state)
        now = self._clock()
        yield from fleet_families(state.fleet, state.settings, now, wanted_counts(state.scales))
        yield held_family(state)


def held_family(state: ControlState) -> Metric:
    """`llmgw_model_requests_held`: per model scaled to zero, the requests the gateway holds while a replica starts
    (`ControlState.held`; a model without any is left out)."""
    held = GaugeMetricFamily("llmgw_model_requests_held", "Requests the gateway holds for a model scaled to zero "
                             "while a replica starts.", labels=["model"])
    for name, count in sorted(state.held.items()):
        held.add_metric([name], count)
    return held


def render_metrics(collector: ControlCollector, gateway_registry: CollectorRegistry | None = None) -> bytes:
    """The text exposition of `collector` followed by `gateway_registry`'s (None: no gateway)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    body = generate_latest(registry)
    if gateway_registry is not None:
        body += generate_latest(gateway_registry)
    return body
