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
  Its quotas are listed narrowest first: project, team, organisation; scopes without any limit are left out.
- `stopped` is `serving.stopped`; replicas are listed anyway (the gateway answers 503 system_stopped).
- A model's LoRA adapters are routes of their own (`adapter_of` the model, its prices), served by the model's
  replicas that run the settings' fingerprint, so each holds the adapter as numbered now (a replica still
  running an older generation during a roll may lack it, or number it otherwise). llama.cpp is told which adapter
  by the `lora` field (`llmgw.engines.llamacpp.lora_request_field`): the adapter's position at scale 1 and every
  other at 0, and all at 0 for the model's own name, so no client applies an adapter under the model's name; vLLM
  by the adapter's name as `model`.
  A project's `models` name adapters on their own: allowing a model does not allow its adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from llmgw.engines.llamacpp import LORA_FIELD, lora_request_field
from llmgw.identity import Quota, ShardState
from llmgw.plan.identity import engine_version_of, fingerprint
from llmgw.plan.types import Fleet
from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute, RouteTable
from llmgw.settings.model import Model, Settings


def _limits(quota: Quota) -> Quota | None:
    """`quota`, or None when it limits nothing (the table then carries no scope for it)."""
    return None if quota == Quota() else quota


def ready_replicas(fleet: Fleet) -> dict[str, list[ReplicaRoute]]:
    """Ready replicas by model name, each without a replica key yet, in (node id, replica id) order."""
    found: dict[str, list[ReplicaRoute]] = {}
    for node in fleet.nodes:
        if not node.alive:
            continue
        for shard in node.shards:
            if shard.state is not ShardState.READY or shard.adopted_foreign or not shard.port or shard.rank:
                continue  # a rank above 0 of a replica spread over nodes serves no API (vLLM --headless)
            found.setdefault(shard.model, []).append(ReplicaRoute(
                replica_id=shard.replica_id,
                node_id=node.node_id,
                base_url=f"http://{node.address}:{shard.port}",
                settings_commit=shard.settings_commit or None,
            ))
    for routes in found.values():
        routes.sort(key=lambda r: (r.replica_id, r.node_id))
    return found


def running(fleet: Fleet, model: str, wanted: str) -> set[str]:
    """The ids of `model`'s replicas whose serving shard (rank 0) is ready with fingerprint `wanted`."""
    return {shard.replica_id for node in fleet.nodes if node.alive for shard in node.shards
            if shard.model == model and shard.state is ShardState.READY and not shard.rank
            and shard.fingerprint == wanted}


def adapter_routes(settings: Settings, model: Model, replicas: tuple[ReplicaRoute, ...],
                   fleet: Fleet) -> list[ModelRoute]:
    """One route per LoRA adapter of `model` (see the module), over those of `replicas` running its fingerprint."""
    if not model.adapters:
        return []
    current = running(fleet, model.name, fingerprint(model, engine_version_of(settings, model)))
    serving = tuple(r for r in replicas if r.replica_id in current)
    return [ModelRoute(
        name=adapter.name, replicas=serving, adapter_of=model.name,
        prompt_price_per_million=model.prices.prompt_per_million,
        completion_price_per_million=model.prices.completion_per_million,
        body_fields=MappingProxyType({LORA_FIELD: lora_request_field(index, len(model.adapters))}
                                     if model.engine == "llama.cpp" else {}),
        routing=model.routing,
    ) for index, adapter in enumerate(model.adapters)]


def build_route_table(
    settings: Settings | None,
    fleet: Fleet,
    replica_key: Callable[[str], str],
    secret: Callable[[str], str | None] = lambda name: None,
) -> RouteTable:
    """The routing table for `settings` (None: no settings in force, an empty table) over `fleet`.

    `replica_key(replica_id)` returns a replica's replica key; `secret(name)` a named secret's value or None.
    """
    if settings is None:
        return RouteTable()
    ready = ready_replicas(fleet)
    models = {}
    for name in sorted(settings.models):
        model = settings.models[name]
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
            replicas = tuple(
                ReplicaRoute(
                    replica_id=r.replica_id, node_id=r.node_id, base_url=r.base_url,
                    replica_key=replica_key(r.replica_id), settings_commit=r.settings_commit,
                )
                for r in ready.get(name, ())
            )
        base_fields = ({LORA_FIELD: lora_request_field(None, len(model.adapters))}
                       if model.adapters and model.engine == "llama.cpp" else {})
        models[name] = ModelRoute(
            name=name,
            aliases=tuple(model.aliases),
            replicas=replicas,
            prompt_price_per_million=model.prices.prompt_per_million,
            completion_price_per_million=model.prices.completion_per_million,
            body_fields=MappingProxyType(base_fields),
            routing=model.routing,
        )
        for route in adapter_routes(settings, model, replicas, fleet):
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
        scopes = [(f"project:{name}", project.quota)]
        team = settings.teams.get(project.team)
        if team is not None:
            scopes.append((f"team:{team.name}", team.quota))
        organisation = settings.organisations.get(project.organisation)
        if organisation is not None:
            scopes.append((f"org:{organisation.name}", organisation.quota))
        quotas = tuple((key, limits) for key, quota in scopes if (limits := _limits(quota)) is not None)
        projects[name] = ProjectPolicy(
            name=name, team=project.team, organisation=project.organisation, models=allowed, quotas=quotas,
        )
    return RouteTable(
        models=MappingProxyType(models),
        projects=MappingProxyType(projects),
        stopped=settings.cluster.serving_stopped,
        settings_commit=settings.commit,
        max_request_body_bytes=settings.cluster.max_request_body_bytes,
        currency=settings.cluster.currency,
    )
