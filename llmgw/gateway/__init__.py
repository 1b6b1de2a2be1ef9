"""llmgw.gateway: the OpenAI-compatible API (auth, quotas, usage, routing, streaming proxy, metrics).

`Gateway(store, table)` serves with `await gateway.serve(host, port, task_status=...)` or embeds as
`gateway.asgi_app`; the control plane replaces its routing table with `gateway.set_table(table)`.
"""

from llmgw.gateway.app import Gateway
from llmgw.gateway.asgi import serve_lifespan
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.problems import ApiError
from llmgw.gateway.routing import Balancer, choose_replica, prefix_key
from llmgw.gateway.streaming import SseRelay
from llmgw.gateway.tracing import GatewayTracing, open_gateway_tracing
from llmgw.gateway.upstream import Timeouts, UpstreamFailure, UpstreamPool

__all__ = [
    "ApiError",
    "Balancer",
    "Gateway",
    "GatewayMetrics",
    "GatewayTracing",
    "SseRelay",
    "Timeouts",
    "UpstreamFailure",
    "UpstreamPool",
    "choose_replica",
    "open_gateway_tracing",
    "prefix_key",
    "serve_lifespan",
]
