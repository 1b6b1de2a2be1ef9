"""llmgw.gateway: the OpenAI-compatible API (auth, quotas, usage, routing, streaming proxy, metrics).

`Gateway(store, table)` serves with `await gateway.serve(host, port, task_status=...)` or embeds as
`gateway.asgi_app`; the control plane replaces its routing table with `gateway.set_table(table)`.
`GatewayWorkers` runs the same gateway as N worker processes sharing the port (`listeners.gateway.workers`).
`BatchRunner(gateway, holder)` runs the lines of /v1/batches on the replicas' idle capacity.
"""

from llmgw.gateway.app import Gateway
from llmgw.gateway.asgi import serve_lifespan
from llmgw.gateway.batch_runner import BatchRunner
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.problems import ApiError
from llmgw.gateway.routing import Balancer, choose_replica, prefix_key
from llmgw.gateway.streaming import SseRelay
from llmgw.gateway.tracing import GatewayTracing, open_gateway_tracing
from llmgw.gateway.upstream import Timeouts, UpstreamFailure, UpstreamPool
from llmgw.gateway.workers import GatewayWorkers, drain_spools, worker_count, worker_spools

__all__ = [
    "ApiError",
    "Balancer",
    "BatchRunner",
    "Gateway",
    "GatewayMetrics",
    "GatewayTracing",
    "GatewayWorkers",
    "SseRelay",
    "Timeouts",
    "UpstreamFailure",
    "UpstreamPool",
    "choose_replica",
    "drain_spools",
    "open_gateway_tracing",
    "prefix_key",
    "serve_lifespan",
    "worker_count",
    "worker_spools",
]
