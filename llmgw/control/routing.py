"""Building the gateway's `RouteTable` from the settings in force and the ready shards of the fleet.

Pure: settings, fleet and two lookups (replica key of a replica, value of a named secret) in, a new immutable
`llmgw.routes.RouteTable` out. The control plane calls it whenever either input changes and hands the result
to `Gateway.set_table`.

Rules:
- A replica is routed to when its shard ("<replica>/0", or "<replica>/0@<fp>" while it rolls; a replica has one
  shard, see `llmgw.identity`) is READY on a node that is alive; the URL is
  `http://<node address>:<shard port>` and the bearer key is `replica_key(replica id)`. A replica spread over
  several nodes is routed to its rank 0 only, which is ready once every rank joined.
- A model with `endpoints` routes to those servers (`external=True`), keyed by the secret the endpoint names.
- A project's `models` are resolved from names or aliases to catalog names; `*` means every model (None).
  Its quotas are `Settings.quota_scopes`: narrowest first (project, team, organisation), scopes without any limit
  left out.
- `stopped` is `serving.stopped`; replicas are listed anyway (the gateway answers 503 system_stopped).
- A model under a canary rollout (`canaries`: model -> (the new revision's fingerprint, share)) lists the ready
  shards running that fingerprint as `canary` replicas, "<replica>@canary", beside the others, and its route
  carries the share (`ModelRoute.canary_share`; llmgw.control.canaries says which share: 0 once it failed).
- A model's LoRA adapters are routes of their own (`adapter_of` the model, its prices), served by the model's
  replicas that run the settings' fingerprint, so each holds the adapter as numbered now (a replica still
  running an older generation during a roll may lack it, or number it otherwise). llama.cpp is told which adapter
  by the `lora` field (`llmgw.engines.llamacpp.lora_request_field`): the adapter's position at scale 1 and every
  other at 0, and all at 0 for the model's own name, so no client applies an adapter under the model's name; vLLM
  by the adapter's name as `model`.
  A project's `models` name adapters on their own: allowing a model does not allow its adapters.
- A model's route (and its adapters') carries its `context_size` when llmgw starts its engines with it (`-c`,
  `--max-model-len`, `--context-length`): not for `endpoints` (their servers' context is their own) nor when
  `engine_args` set the context again or let llama-server generate past it (CONTEXT_ARGS); None there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from llmgw.engines.llamacpp import LORA_FIELD, lora_request_field
from llmgw.identity import ShardState
from llmgw.plan.identity import engine_version_of, fingerprint
from llmgw.control.registry import FleetRegistry
from llmgw.plan.types import Fleet, ObservedShard
from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute, ReplicaSpeed, RouteTable
from llmgw.settings.model import Model, Settings


CONTEXT_ARGS = frozenset({"-c", "--ctx-size", "--context-shift", "--max-model-len", "--context-length"})
"""Engine arguments after which the catalog's `context_size` no longer bounds what one request generates."""


def engine_context(model: Model) -> int | None:
    """The context window in tokens every engine of `model` runs with, so a request without `max_tokens` stops
    there; None when llmgw does not know it (see the module)."""
    if model.endpoints or any(arg.split("=", 1)[0] in CONTEXT_ARGS for arg in model.engine_args):
        return None
    return model.context_size


Served = tuple[str, ReplicaRoute, str]
"""One ready serving shard: (model, its route with the replica key, its fingerprint)."""


def node_routes(node_id: str, address: str, shards: Iterable[ObservedShard],
                replica_key: Callable[[str], str]) -> tuple[Served, ...]:
    """The ready serving shards of one live node: READY, ours, with a port, rank 0 (a rank above 0 of a replica
    spread over nodes serves no API: vLLM --headless)."""
    return tuple(
        (shard.model, ReplicaRoute(replica_id=shard.replica_id, node_id=node_id,
                                   base_url=f"http://{address}:{shard.port}",
                                   replica_key=replica_key(shard.replica_id),
                                   settings_commit=shard.settings_commit or None), shard.fingerprint)
        for shard in shards
        if shard.state is ShardState.READY and not shard.adopted_foreign and shard.port and not shard.rank)


class ReadyRoutes:
    """The ready replicas of a fleet by model, kept per node: `sync(registry)` looks again only at nodes whose
    record changed what routing reads (lost or not, address, shards), so a rebuild of the routing table after one
    node's change costs that node plus one identity check per node, not a copy of every node (at 2,000 nodes the
    copies were 14% of the trio loop's long steps while the fleet joined: docs/scale.md).

    `replica_key(replica_id)` gives each route its replica key. Not thread-safe; owned by one caller (the control
    plane). `ReadyRoutes.of(fleet, replica_key)` is the same index built at once from a `Fleet`.
    """

    def __init__(self, replica_key: Callable[[str], str]):
        self._replica_key = replica_key
        self._nodes: dict[str, tuple[tuple, tuple[Served, ...]]] = {}
        self._models: dict[str, dict[tuple[str, str, int], Served]] = {}
        self._sorted: dict[str, tuple[ReplicaRoute, ...]] = {}
        self._seen: tuple[object, int] | None = None
        self.looked_at = 0
        """Nodes whose routes were worked out again since this index was made (a count, for tests)."""

    @classmethod
    def of(cls, fleet: Fleet, replica_key: Callable[[str], str]) -> ReadyRoutes:
        """The index of `fleet`'s alive nodes."""
        ready = cls(replica_key)
        for node in fleet.nodes:
            if node.alive:
                ready._set(node.node_id, (node.address, node.shards), node.address, node.shards)
        return ready

    def sync(self, registry: FleetRegistry) -> None:
        """Bring the index to `registry`'s records (lost nodes serve nothing). Nothing is looked at when the
        registry's line and revision are the ones last synced (every change of shards, loss or registration moves
        the revision)."""
        if self._seen == (registry.line, registry.revision):
            return
        records = registry.records()
        for record in records:
            node = record.state
            key = (None, ()) if record.lost else (node.address, node.shards)
            kept = self._nodes.get(node.node_id)
            if kept is not None and (kept[0] is key or kept[0] == key):
                continue
            self._set(node.node_id, key, *key)
        if len(self._nodes) > len(records):
            ids = {r.node_id for r in records}
            for gone in [n for n in self._nodes if n not in ids]:
                self._set(gone, None, None, ())
        self._seen = (registry.line, registry.revision)

    def _set(self, node_id: str, key: tuple | None, address: str | None, shards: Iterable[ObservedShard]) -> None:
        self.looked_at += 1
        old = self._nodes.pop(node_id, None)
        for n, (model, route, _) in enumerate(old[1] if old else ()):
            self._models[model].pop((route.replica_id, node_id, n), None)
            self._sorted.pop(model, None)
        if key is None:
            return
        served = node_routes(node_id, address or "", shards, self._replica_key)
        self._nodes[node_id] = (key, served)
        for n, entry in enumerate(served):  # n: two shards of one replica on one node (a roll) both serve
            self._models.setdefault(entry[0], {})[(entry[1].replica_id, node_id, n)] = entry
            self._sorted.pop(entry[0], None)

    def routes(self, model: str) -> tuple[ReplicaRoute, ...]:
        """`model`'s ready replicas, in (replica id, node id) order."""
        kept = self._sorted.get(model)
        if kept is None:
            entries = self._models.get(model, {})
            kept = self._sorted[model] = tuple(entries[k][1] for k in sorted(entries))
        return kept

    def fingerprinted(self, model: str) -> tuple[tuple[ReplicaRoute, str], ...]:
        """`model`'s ready replicas with the fingerprint their serving shard runs, in `routes` order."""
        entries = self._models.get(model, {})
        return tuple((entries[k][1], entries[k][2]) for k in sorted(entries))

    def running(self, model: str, wanted: str) -> set[str]:
        """The ids of `model`'s ready replicas whose serving shard runs fingerprint `wanted`."""
        return {route.replica_id for _, route, fp in self._models.get(model, {}).values() if fp == wanted}


def canary_routes(served: tuple[tuple[ReplicaRoute, str], ...], fingerprint: str,
                  share: float) -> tuple[tuple[ReplicaRoute, ...], float | None]:
    """(the routes of `served` with those running `fingerprint` made canary replicas, "<replica>@canary"; the
    model's canary share: `share`, or None when no canary replica or no other one is ready)."""
    routes = tuple(replace(route, replica_id=f"{route.replica_id}@canary", canary=True) if fp == fingerprint
                   else route for route, fp in served)
    marked = sum(1 for r in routes if r.canary)
    return routes, (share if 0 < marked < len(routes) else None)


def adapter_routes(settings: Settings, model: Model, replicas: tuple[ReplicaRoute, ...],
                   ready: ReadyRoutes) -> list[ModelRoute]:
    """One route per LoRA adapter of `model` (see the module), over those of `replicas` running its fingerprint."""
    if not model.adapters:
        return []
    current = ready.running(model.name, fingerprint(model, engine_version_of(settings, model)))
    serving = tuple(r for r in replicas if r.replica_id in current)
    return [ModelRoute(
        name=adapter.name, replicas=serving, adapter_of=model.name,
        prompt_price_per_million=model.prices.prompt_per_million,
        completion_price_per_million=model.prices.completion_per_million,
        batch_prompt_price_per_million=model.prices.batch_prompt_per_million,
        batch_completion_price_per_million=model.prices.batch_completion_per_million,
        body_fields=MappingProxyType({LORA_FIELD: lora_request_field(index, len(model.adapters))}
                                     if model.engine == "llama.cpp" else {}),
        routing=model.routing, context_size=engine_context(model),
    ) for index, adapter in enumerate(model.adapters)]


def build_route_table(
    settings: Settings | None,
    fleet: Fleet | ReadyRoutes,
    replica_key: Callable[[str], str],
    secret: Callable[[str], str | None] = lambda name: None,
    speeds: Mapping[str, ReplicaSpeed] = MappingProxyType({}),
    canaries: Mapping[str, tuple[str, float]] = MappingProxyType({}),
) -> RouteTable:
    """The routing table for `settings` (None: no settings in force, an empty table) over `fleet`: a `Fleet`, or
    its ready replicas already indexed (`ReadyRoutes`, kept in step with the registry by the control plane; the
    table is the same).

    `replica_key(replica_id)` returns a replica's replica key; `secret(name)` a named secret's value or None;
    `speeds` each replica's measured speed by replica id (`llmgw.control.speeds`; missing: not measured);
    `canaries` model name -> (fingerprint of its canary's revision, the canary's share) (see the module).
    """
    if settings is None:
        return RouteTable()
    ready = fleet if isinstance(fleet, ReadyRoutes) else ReadyRoutes.of(fleet, replica_key)
    models = {}
    for name in sorted(settings.models):
        model = settings.models[name]
        canary_share = None
        if model.endpoints:
            replicas = tuple(
                ReplicaRoute(
                    replica_id=f"{name}-external-{i}",
                    node_id="",
                    base_url=endpoint.url.rstrip("/"),
                    replica_key=secret(endpoint.secret) if endpoint.secret else None,
                    external=True,
                    upstream_model=endpoint.model,
                )
                for i, endpoint in enumerate(model.endpoints)
            )
        else:
            replicas = ready.routes(name)
            if name in canaries:
                replicas, canary_share = canary_routes(ready.fingerprinted(name), *canaries[name])
            if speeds:
                replicas = tuple(replace(r, speed=speeds[r.replica_id]) if r.replica_id in speeds else r
                                 for r in replicas)
        base_fields = ({LORA_FIELD: lora_request_field(None, len(model.adapters))}
                       if model.adapters and model.engine == "llama.cpp" else {})
        models[name] = ModelRoute(
            name=name,
            aliases=tuple(model.aliases),
            replicas=replicas,
            prompt_price_per_million=model.prices.prompt_per_million,
            completion_price_per_million=model.prices.completion_per_million,
            batch_prompt_price_per_million=model.prices.batch_prompt_per_million,
            batch_completion_price_per_million=model.prices.batch_completion_per_million,
            body_fields=MappingProxyType(base_fields),
            routing=model.routing,
            context_size=engine_context(model),
            engine=model.engine,
            rerank=model.rerank,
            canary_share=canary_share,
            wakes=model.scaling is not None and model.scaling.min == 0 and not model.endpoints,
            off=model.scaling is None and model.replicas == 0 and not model.endpoints,
        )
        for route in adapter_routes(settings, model, replicas, ready):
            models[route.name] = route
    projects = {}
    for name in sorted(settings.projects):
        project = settings.projects[name]
        allowed: frozenset[str] | None
        if "*" in project.models:
            allowed = None
        else:
            resolved = set()
            for wanted in project.models:
                model = settings.resolve_model(wanted)
                resolved.add(model.name if model is not None else wanted)
            allowed = frozenset(resolved)
        projects[name] = ProjectPolicy(
            name=name, team=project.team, organisation=project.organisation, models=allowed,
            quotas=settings.quota_scopes(name),
        )
    return RouteTable(
        models=MappingProxyType(models),
        projects=MappingProxyType(projects),
        stopped=settings.cluster.serving_stopped,
        settings_commit=settings.commit,
        max_request_body_bytes=settings.cluster.max_request_body_bytes,
        currency=settings.cluster.currency,
        responses_retention_seconds=settings.cluster.store.responses_retention,
        max_file_bytes=settings.cluster.max_file_bytes,
        files_retention_seconds=settings.cluster.store.files_retention,
        batch_slot_share=settings.cluster.batch_slot_share,
    )
