"""The routing table: what the gateway needs to know, built by the control plane from settings and the fleet.

Pure data, immutable: the control plane builds a new `RouteTable` whenever settings or replica readiness
change and hands it to the gateway, which reads it without locks. The gateway never imports settings: every
policy it enforces (which project may use which model, quotas up the project -> team -> organisation chain,
prices, `serving.stopped`) is carried here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.identity import Quota, Routing, resolve_model


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class ReplicaSpeed:
    """What one replica was measured to do: the routing policy "expected-time" reads it.

    `prefill_tokens_per_second`, `decode_tokens_per_second`: prompt tokens processed and completion tokens made per
    second by the whole replica (all its requests at once: a batch of 8 at 40 tokens/s each is 320), > 0.
    `slots`: requests it runs at once (llama-server `--parallel`, vLLM `--max-num-seqs`; 0: unknown, never taken
    for full). `measured_at`: epoch seconds; `source`: where the figures came from ("bench", "metrics").
    """

    prefill_tokens_per_second: float
    decode_tokens_per_second: float
    slots: int = 0
    measured_at: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class ReplicaRoute:
    """One ready place that serves a model.

    `base_url` is the engine's root ("http://10.0.0.5:41235", no `/v1`); `replica_key` goes to it as
    `Authorization: Bearer <replica_key>` (None: send none): the replica key (`llmgw.control.replica_key`) of a
    replica llmgw runs, the endpoint's secret for an external one. `external` marks an endpoint llmgw does not run.
    `upstream_model` is the model name to put in the forwarded body (None: leave the body's model as sent).
    `settings_commit`: the settings commit the replica was started from, as its node reports it (None: unknown,
    or an external endpoint); kept in each request's usage record. `speed`: what the replica was measured to do
    (None: not measured), read by the "expected-time" routing policy. `canary`: the replica runs a canary's new
    revision (its `replica_id` is "<replica>@canary", apart from the old shard of the same replica serving beside
    it); the gateway sends it its model's `ModelRoute.canary_share` of requests.
    """

    replica_id: str
    node_id: str
    base_url: str
    replica_key: str | None = None
    external: bool = False
    upstream_model: str | None = None
    settings_commit: str | None = None
    speed: ReplicaSpeed | None = None
    canary: bool = False


@dataclass(frozen=True)
class ModelRoute:
    """A catalog model, or one of its LoRA adapters, as the gateway sees it: its aliases, prices and ready replicas.

    Prices are in the cluster's currency per million tokens (None: free). `replicas` empty means none is
    ready now (the gateway answers 503 with Retry-After). `adapter_of` names the model whose replicas serve this
    LoRA adapter (None: a model of its own); an adapter is allowed, routed, counted and billed under its own name.
    `routing`: the catalog's policy for choosing among `replicas` (an adapter's is its model's).
    `body_fields` are top-level fields the gateway sets in every body it forwards for this name, over the client's
    (llama.cpp's `lora` choosing the adapter, or none for the base model); the `model` sent is the route's name.
    `context_size`: the context window in tokens that every replica's engine was started with, so that a request
    without `max_tokens` stops there (None: unknown, e.g. an external endpoint or the engine's own default).
    `engine`: the catalog's engine ("llama.cpp", "vllm", "sglang"; "" unknown). `rerank`: the catalog says the
    model reranks (`/v1/rerank`, and `/v1/score` on vLLM: `llmgw.gateway.rerank`). `canary_share`: the share
    (0..1) of requests the `canary` replicas take while a canary rollout runs (None: no canary; 0: a failed canary
    that still runs takes none): `llmgw.gateway.routing.canary_pool`.
    `batch_prompt_price_per_million`, `batch_completion_price_per_million`: the prices of a request run as a line
    of /v1/batches (None: the price above). `wakes`: the model scales to zero (`replicas: {min: 0}`): while it has
    no replica, the gateway holds its requests while one starts (`llmgw.gateway.holding`) instead of answering 503
    at once. `off`: the catalog places no replica (`replicas: 0`, no autoscaling, no endpoints), so none will become
    ready: the gateway answers 503 `model_not_serving` without Retry-After instead of "retry in a few seconds".
    """

    name: str
    aliases: tuple[str, ...] = ()
    replicas: tuple[ReplicaRoute, ...] = ()
    prompt_price_per_million: float | None = None
    completion_price_per_million: float | None = None
    created: int = 0
    adapter_of: str | None = None
    body_fields: Mapping[str, object] = field(default_factory=_empty)
    routing: Routing = Routing.PREFIX
    context_size: int | None = None
    engine: str = ""
    rerank: bool = False
    batch_prompt_price_per_million: float | None = None
    batch_completion_price_per_million: float | None = None
    canary_share: float | None = None
    wakes: bool = False
    off: bool = False


@dataclass(frozen=True)
class ProjectPolicy:
    """What a project may do.

    `models` is the set of catalog names the project may use (aliases already resolved to names), or None
    for every model. `quotas` lists (scope key, limits) from the narrowest to the widest, e.g.
    (("project:chat", ...), ("team:research", ...), ("org:acme", ...)); a request must fit every one.
    """

    name: str
    team: str
    organisation: str
    models: frozenset[str] | None = None
    quotas: tuple[tuple[str, Quota], ...] = ()


@dataclass(frozen=True)
class RouteTable:
    """Everything the gateway routes and enforces by. `stopped` is `serving.stopped` of the settings in force."""

    models: Mapping[str, ModelRoute] = field(default_factory=_empty)
    projects: Mapping[str, ProjectPolicy] = field(default_factory=_empty)
    stopped: bool = False
    settings_commit: str | None = None
    max_request_body_bytes: int = 10 * 1024 * 1024
    currency: str = "USD"
    responses_retention_seconds: float = 30 * 86400.0  # llmgw.yaml store.responses_retention (/v1/responses state)
    max_file_bytes: int = 100 * 1024 * 1024  # llmgw.yaml limits.max_file_size (/v1/files uploads)
    files_retention_seconds: float = 30 * 86400.0  # llmgw.yaml store.files_retention (/v1/files, /v1/batches)
    batch_slot_share: float = 0.5  # llmgw.yaml limits.batch_slot_share (/v1/batches)

    def resolve(self, name: str) -> ModelRoute | None:
        """The model called `name` or having `name` as an alias; None for anything else (an engine's own name too).

        `llmgw.identity.resolve_model` over the table's models (the same resolution as the settings')."""
        return resolve_model(self.models, name)


@dataclass(frozen=True)
class ReplicaBlocks:
    """The prefix-cache blocks one replica's engine holds, as its KV-cache events said (vLLM only).

    `blocks`: vLLM's 64-bit block hashes held in every full-attention KV-cache group; `block_size` in tokens (0: no
    block seen yet); `hash_algorithm` and `hash_seed`: how the engine hashes (`--prefix-caching-hash-algo`,
    `PYTHONHASHSEED`), so a prompt can be hashed alike (`llmgw.tools.vllm_hashing` reproduces "sha256_cbor").
    `node_id`: the node whose agent reported them.
    """

    blocks: frozenset[int] = frozenset()
    block_size: int = 0
    hash_algorithm: str = ""
    hash_seed: str = ""
    node_id: str = ""


@dataclass(frozen=True)
class BlockSnapshot:
    """Every replica's held blocks that the control plane knows, by replica id: what precise prefix routing reads.

    Immutable: the control plane builds a new one for each batch of KV-block updates and hands it to the gateway
    (`Gateway.set_blocks`); a replica missing here sends no events (the gateway falls back to its approximate
    policy). `version` grows by one per change, so a reader (a gateway worker process) can tell it is behind.
    """

    replicas: Mapping[str, ReplicaBlocks] = field(default_factory=_empty)
    version: int = 0
