"""The gateway's Prometheus metrics, in a registry of its own (served with the fleet's at the admin listener's
GET /metrics, llmgw.control.metrics).

Names (all prefixed `llmgw_gateway_`): requests_total{model,project,status}, request_duration_seconds{model}
and time_to_first_token_seconds{model} histograms, prompt_tokens_total / completion_tokens_total{model,project},
requests_in_flight{model}, quota_rejections_total{project,limit}, ready_replicas{model}.

Gateway worker processes (`llmgw.gateway.workers`) run prometheus_client's multiprocess mode: the gauges say how
to combine the workers' values (in flight: the live workers' sum; ready replicas: their maximum, all seeing one
table); outside that mode the setting is ignored.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llmgw.routes import RouteTable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """Counters and histograms for one gateway; `registry` None creates a fresh CollectorRegistry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("llmgw_gateway_requests", "Requests answered, by model, project and HTTP status.",
                                ["model", "project", "status"], registry=r)
        self.duration = Histogram("llmgw_gateway_request_duration_seconds", "Whole request duration, seconds.",
                                  ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("llmgw_gateway_time_to_first_token_seconds", "Time to the first streamed token, seconds.",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("llmgw_gateway_prompt_tokens", "Prompt tokens billed.", ["model", "project"],
                                     registry=r)
        self.completion_tokens = Counter("llmgw_gateway_completion_tokens", "Completion tokens billed.",
                                         ["model", "project"], registry=r)
        self.in_flight = Gauge("llmgw_gateway_requests_in_flight", "Requests being proxied now.", ["model"], registry=r,
                               multiprocess_mode="livesum")
        self.quota_rejections = Counter("llmgw_gateway_quota_rejections", "Requests refused for quota (429).",
                                        ["project", "limit"], registry=r)
        self.routing_decisions = Counter(
            "llmgw_gateway_routing_decisions", "Replica choices by kind: precise (KV blocks the engine holds), "
            "approximate (prompt-prefix affinity), least-loaded, round-robin (the model's routing policy).",
            ["model", "kind"], registry=r)
        self.ready_replicas = Gauge("llmgw_gateway_ready_replicas", "Replicas in the routing table, per model.",
                                    ["model"], registry=r, multiprocess_mode="livemax")

        self._children: dict[tuple, object] = {}

    def child(self, metric, *labels: str):
        """`metric.labels(*labels)`, remembered (prometheus-client's labels() costs ~10 us: locks, validation);
        label sets are bounded by the catalog, projects and statuses."""
        key = (id(metric), labels)  # the metrics live as long as this object
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= 10000:
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found

    def count_request(self, model: str, project: str, status: int) -> None:
        """Count one request of `model` (a catalog name, or the admission's UNKNOWN_MODEL) by `project` answered
        `status` (`requests`)."""
        self.child(self.requests, model, project, str(status)).inc()

    def observe_table(self, table: RouteTable) -> None:
        """Set ready_replicas from a new routing table (models that left it drop to 0)."""
        for labels in list(self.ready_replicas._metrics):  # noqa: SLF001 - prometheus-client has no public listing
            if labels[0] not in table.models:
                self.ready_replicas.labels(labels[0]).set(0)
        for name, route in table.models.items():
            self.ready_replicas.labels(name).set(len(route.replicas))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
