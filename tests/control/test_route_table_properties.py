"""The routing table kept per node (`ReadyRoutes.sync`, incremental) as a property (hypothesis): after any sequence of
registry transitions (registrations, new addresses, heartbeats with new or the same shards, shard statuses, streams
ending, nodes lost to silence, another control plane's registry), the table is the one built from the whole fleet at
once. tests/control/test_ready_routes.py runs seeded sequences of the same kind."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import fleet_for
from llmgw.control.routing import ReadyRoutes, build_route_table
from llmgw.plan.identity import engine_version_of, fingerprint
from llmgw.plan.types import NodeState, ObservedShard, ShardState

from .test_adapter_routes import settings as adapter_settings

SETTINGS = adapter_settings()
MODELS = sorted(SETTINGS.models)
CURRENT = {name: fingerprint(m, engine_version_of(SETTINGS, m)) for name, m in SETTINGS.models.items()}
NODES = 6
STATES = st.sampled_from([ShardState.READY] * 4 + list(ShardState))  # most shards serve: the table is not empty


def key(replica_id: str) -> str:
    return f"key-{replica_id}"


@st.composite
def shard_lists(draw, node: int) -> tuple[ObservedShard, ...]:
    """Shards one node may report: serving or not, ours or adopted, rank 0 or above, current or old, two shards of a
    replica while it rolls."""
    shards = {}
    for n in range(draw(st.integers(0, 3))):
        model = draw(st.sampled_from(MODELS))
        replica = f"{model}-{draw(st.integers(0, 3))}"
        shard_id = f"{replica}/0{draw(st.sampled_from(['', '@old']))}"
        shards[shard_id] = ObservedShard(
            shard_id, replica, model, draw(STATES), port=draw(st.sampled_from([9000 + node * 10 + n] * 3 + [0])),
            fingerprint=draw(st.sampled_from([CURRENT[model], "old"])), rank=draw(st.sampled_from([0, 0, 0, 1])),
            adopted_foreign=draw(st.sampled_from([False] * 5 + [True])), settings_commit=draw(st.sampled_from(["", "c1"])))
    return tuple(sorted(shards.values(), key=lambda s: s.shard_id))


@st.composite
def transitions(draw, registry: FleetRegistry, now: float) -> FleetRegistry:
    """One step of the fleet: a few nodes change, then those silent too long are lost."""
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, NODES - 1))
        node_id = f"n{n}"
        record = registry.get(node_id)
        kinds = ["register"] + (["heartbeat-new", "heartbeat-same", "shard-status", "disconnect", "readdress"]
                                 if record else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "readdress":  # the same shards at another address
            node = replace(record.state, address=f"10.1.{draw(st.integers(0, 1))}.{n}")
            registry, _ = registry.register(node, now)
        elif kind == "register":
            node = NodeState(node_id, address=f"10.0.{draw(st.integers(0, 1))}.{n}", shards=draw(shard_lists(n)))
            registry, _ = registry.register(node, now)
        elif kind == "heartbeat-new":
            registry, _ = registry.heartbeat(node_id, now, shards=draw(shard_lists(n)))
        elif kind == "heartbeat-same":
            registry, _ = registry.heartbeat(node_id, now, shards=tuple(replace(s) for s in record.state.shards))
        elif kind == "shard-status" and record.state.shards:
            shard = draw(st.sampled_from(record.state.shards))
            registry, _ = registry.shard_status(node_id, replace(shard, state=draw(STATES)),
                                                now)
        elif kind == "disconnect":
            registry, _ = registry.disconnect(node_id, now)
    registry, _ = registry.expire(now)
    return registry


def takeover(registry: FleetRegistry, keep: list[bool], now: float) -> FleetRegistry:
    """A registry of another line (another control plane took over) that the nodes of `keep` registered with."""
    fresh = FleetRegistry(lost_after=registry.lost_after)
    for record, kept in zip(registry.records(), keep):
        if kept:
            fresh, _ = fresh.register(record.state, now)
    return fresh


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_table_kept_per_node_is_the_table_built_from_the_whole_fleet(data):
    registry, now = FleetRegistry(lost_after=30.0), 0.0
    ready = ReadyRoutes(key)
    for _ in range(data.draw(st.integers(1, 12))):
        now += data.draw(st.sampled_from([1.0, 5.0, 40.0]))
        if registry.records() and data.draw(st.integers(0, 9)) == 0:
            registry = takeover(registry, data.draw(st.lists(st.booleans(), min_size=NODES, max_size=NODES)), now)
        registry = data.draw(transitions(registry, now))
        ready.sync(registry)
        whole = fleet_for(registry.fleet(), SETTINGS)
        expected = build_route_table(SETTINGS, whole, key)
        assert build_route_table(SETTINGS, ready, key) == expected
        for model in MODELS:
            assert ready.running(model, CURRENT[model]) == ReadyRoutes.of(whole, key).running(model, CURRENT[model])
