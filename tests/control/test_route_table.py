"""Building the gateway's routing table from settings and ready shards."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from llmgw.control.keys import replica_key
from llmgw.control.routing import build_route_table
from llmgw.plan.types import Fleet, NodeState, ObservedShard, ShardState
from llmgw.identity import Routing
from llmgw.routes import Quota
from llmgw.settings.model import (
    Adapter, ClusterSettings, Endpoint, Model, Organisation, Prices, Project, Quota, Settings, Team, WeightsFile,
)

SECRET = b"s" * 32


def settings(**cluster) -> Settings:
    models = {
        "gemma": Model(name="gemma", engine="llama.cpp", aliases=("g",), prices=Prices(0.1, 0.2)),
        "qwen": Model(name="qwen", engine="llama.cpp", routing=Routing.LEAST_LOADED),
        "remote": Model(name="remote", engine="llama.cpp", endpoints=(
            Endpoint(url="https://api.example.com/", secret="remote-key", model="gpt-x"),)),
    }
    return Settings(
        cluster=ClusterSettings(name="t", **cluster),
        models=MappingProxyType(models),
        organisations=MappingProxyType({"acme": Organisation("acme", Quota(tokens_per_day=1000))}),
        teams=MappingProxyType({"research": Team("research", "acme")}),
        projects=MappingProxyType({
            "chat": Project("chat", "research", "acme", models=("g", "qwen"), quota=Quota(requests_per_minute=5)),
            "all": Project("all", "research", "acme"),
        }),
        commit="c0ffee",
    )


def shard(sid: str, state: ShardState, port: int) -> ObservedShard:
    replica = sid.split("/")[0]
    return ObservedShard(sid, replica, replica.rsplit("-", 1)[0], state, port=port)


def fleet(alive2: bool = True) -> Fleet:
    return Fleet(nodes=(
        NodeState("n1", address="10.0.0.1", shards=(
            shard("gemma-0/0", ShardState.READY, 9001), shard("qwen-0/0", ShardState.STARTING, 9002))),
        NodeState("n2", address="10.0.0.2", alive=alive2, shards=(shard("gemma-1/0", ShardState.READY, 9003),)),
    ))


def table(fl=None, **cluster):
    return build_route_table(
        settings(**cluster), fl or fleet(), lambda rid: replica_key(SECRET, rid),
        lambda name: {"remote-key": "sk-remote"}.get(name),
    )


@pytest.mark.parametrize(
    "model, expected",
    [
        ("gemma", [("gemma-0", "http://10.0.0.1:9001"), ("gemma-1", "http://10.0.0.2:9003")]),
        ("qwen", []),  # starting, not ready: no route (the gateway answers 503 with Retry-After)
    ],
)
def test_only_ready_replicas_on_live_nodes_are_routed(model, expected):
    routes = table().models[model].replicas
    assert [(r.replica_id, r.base_url) for r in routes] == expected
    assert all(r.replica_key == replica_key(SECRET, r.replica_id) for r in routes)


def test_a_replica_on_a_node_not_alive_is_not_routed():
    routes = table(fleet(alive2=False)).models["gemma"].replicas
    assert [r.node_id for r in routes] == ["n1"]


def test_models_with_endpoints_route_to_them_with_their_secret():
    (route,) = table().models["remote"].replicas
    assert route.external and route.base_url == "https://api.example.com"
    assert route.replica_key == "sk-remote" and route.upstream_model == "gpt-x"


def test_aliases_prices_and_commit_are_carried():
    t = table()
    assert t.resolve("g").name == "gemma"
    assert t.models["gemma"].prompt_price_per_million == 0.1
    assert t.settings_commit == "c0ffee" and t.stopped is False


def test_serving_stopped_is_carried_into_the_table():
    assert table(serving_stopped=True).stopped is True


def test_project_models_are_resolved_and_quotas_listed_narrowest_first():
    t = table()
    chat = t.projects["chat"]
    assert chat.models == frozenset({"gemma", "qwen"})
    assert chat.quotas == (
        ("project:chat", Quota(requests_per_minute=5)),
        ("org:acme", Quota(tokens_per_day=1000)),
    )
    assert t.projects["all"].models is None


def test_replica_keys_are_hmac_of_the_replica_id_and_differ_per_replica():
    a, b = replica_key(SECRET, "gemma-0"), replica_key(SECRET, "gemma-1")
    assert len(a) == 64 and a != b and a == replica_key(SECRET, "gemma-0")
    assert replica_key(b"other", "gemma-0") != a


def test_each_model_is_routed_by_its_catalog_policy_prefix_unless_it_says_otherwise():
    models = table().models
    assert (models["gemma"].routing, models["qwen"].routing) == (Routing.PREFIX, Routing.LEAST_LOADED)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"context_size": 512}, 512),  # the engine is started with it (-c, --max-model-len): requests stop there
    ({}, None),  # the engine's own default context: unknown to the gateway
    ({"context_size": 512, "engine_args": ("--ctx-size=4096",)}, None),  # set again by the engine's arguments
    ({"context_size": 512, "engine_args": ("--context-shift",)}, None),  # llama-server generates past it
    ({"context_size": 512, "endpoints": (Endpoint(url="https://api.example.com/"),)}, None),  # not ours to start
])
def test_a_models_route_carries_the_context_its_engines_run_with_and_its_adapters_too(changes, expected):
    base = settings()
    gemma = replace(base.models["gemma"], adapters=(Adapter("gemma-pirate", (WeightsFile("file:///p.gguf", "b" * 64),)),),
                    **changes)
    routes = build_route_table(replace(base, models=MappingProxyType({**base.models, "gemma": gemma})), fleet(),
                               lambda rid: replica_key(SECRET, rid)).models
    assert routes["gemma"].context_size == expected and routes["gemma-pirate"].context_size == expected


@pytest.mark.parametrize("shares, ready_old, expected_share", [
    ((0.1,), True, 0.1),   # running: the canary takes its share beside the old replicas
    ((0.0,), True, 0.0),   # failed and not stopped yet: it takes none
    ((0.1,), False, None),  # only the canary is ready: no split, it serves
])
def test_a_canary_revision_is_routed_apart_from_the_old_replicas_with_its_share(shares, ready_old, expected_share):
    old_state = ShardState.READY if ready_old else ShardState.STOPPING
    shards = (replace(shard("gemma-0/0", old_state, 9001), fingerprint="old"),
              replace(shard("gemma-0/0", ShardState.READY, 9005), shard_id="gemma-0/0@new", fingerprint="new"))
    fl = Fleet(nodes=(NodeState("n1", address="10.0.0.1", shards=shards),))
    routes = build_route_table(settings(), fl, lambda rid: replica_key(SECRET, rid),
                               canaries={"gemma": ("new", *shares)}).models
    replicas = {r.replica_id: (r.base_url, r.canary, r.replica_key) for r in routes["gemma"].replicas}
    expected = {"gemma-0@canary": ("http://10.0.0.1:9005", True, replica_key(SECRET, "gemma-0"))}
    if ready_old:
        expected["gemma-0"] = ("http://10.0.0.1:9001", False, replica_key(SECRET, "gemma-0"))
    assert replicas == expected
    assert routes["gemma"].canary_share == expected_share and routes["qwen"].canary_share is None
