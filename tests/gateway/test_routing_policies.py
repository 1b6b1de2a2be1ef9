"""The routing policies, one class per catalog `routing`: what each chooses, and that each decides as the pure
choice functions whose tables (test_routing_policy.py, test_prefix_routing_from_kv_events.py) pin the decisions."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llmgw.gateway.routing import (
    APPROXIMATE, LEAST_LOADED, PRECISE, ROUND_ROBIN, Balancer, PromptBlocks, RoutingFacts, choose_replica,
)
from llmgw.gateway.routing_policies import (
    POLICIES, ExpectedTime, LeastLoaded, PreciseKv, PrefixAffinity, RoundRobin, policy_of,
)
from llmgw.gateway.routing_prefix import choose_by_blocks
from llmgw.identity import Routing
from llmgw.routes import ModelRoute, ReplicaRoute

A, B, C = (ReplicaRoute(replica_id=i, node_id="n", base_url=f"http://{i}") for i in ("a", "b", "c"))
ABC = (A, B, C)


@pytest.mark.parametrize(("routing", "policy", "by_prefix"), [
    (Routing.ROUND_ROBIN, RoundRobin, False),
    (Routing.LEAST_LOADED, LeastLoaded, False),
    (Routing.PREFIX, PreciseKv, True),
    (Routing.EXPECTED_TIME, ExpectedTime, True),
])
def test_each_catalog_routing_names_one_policy_class(routing, policy, by_prefix):
    chosen = policy_of(ModelRoute(name="m", replicas=ABC, routing=routing))
    assert type(chosen) is policy and chosen.by_prefix is by_prefix


def test_every_routing_of_the_catalog_has_a_policy():
    assert set(POLICIES) == set(Routing)


def test_round_robin_takes_each_replica_in_turn_whatever_their_load():
    load = {"a": 50, "b": 0, "c": 7}
    picks = [RoundRobin().choose(ABC, load, RoutingFacts(rotation=r)) for r in range(6)]
    assert [p.replica for p in picks] == [A, B, C, A, B, C]
    assert {p.kind for p in picks} == {ROUND_ROBIN}


def test_round_robin_leaves_out_tried_and_ejected_replicas_and_ignores_an_affinity():
    facts = RoutingFacts(exclude=frozenset({"a"}), ejected={"b": 100.0}, now=1.0, affinity="b")
    assert RoundRobin().choose(ABC, {}, facts).replica == C
    assert RoundRobin().choose(ABC, {}, RoutingFacts(exclude=frozenset("abc"))).replica is None


def test_least_loaded_takes_the_fewest_in_flight_and_ignores_an_affinity():
    choice = LeastLoaded().choose(ABC, {"a": 2, "b": 1, "c": 3}, RoutingFacts(affinity="a", prefix="p"))
    assert (choice.replica, choice.kind) == (B, LEAST_LOADED)
    assert [LeastLoaded().choose(ABC, {"a": 1}, RoutingFacts(rotation=r)).replica for r in range(2)] == [B, C]
    assert LeastLoaded().choose(ABC, {}, RoutingFacts(exclude=frozenset("abc"))).replica is None


@pytest.mark.parametrize(("load", "affinity", "prefix", "expected", "kind"), [
    ({"a": 2, "b": 1, "c": 3}, "a", "p", A, APPROXIMATE),    # the prefix's replica while under saturation (8)
    ({"a": 8, "b": 0, "c": 3}, "a", "p", B, APPROXIMATE),    # saturated: the least loaded takes it
    ({"a": 2, "b": 1, "c": 3}, None, "p", B, APPROXIMATE),   # a prefix seen for the first time
    ({"a": 2, "b": 1, "c": 3}, None, None, B, LEAST_LOADED),  # no prompt text: least loaded, and said so
])
def test_prefix_affinity_sticks_until_saturated(load, affinity, prefix, expected, kind):
    choice = PrefixAffinity().choose(ABC, load, RoutingFacts(affinity=affinity, prefix=prefix, saturation=8))
    assert (choice.replica, choice.kind) == (expected, kind)


def test_precise_kv_takes_the_replica_holding_the_longest_leading_run_of_the_prompt():
    blocks = PromptBlocks((1, 2, 3), {"a": frozenset({1}), "b": frozenset({1, 2}), "c": None})
    choice = PreciseKv().choose(ABC, {"b": 3}, RoutingFacts(prefix="p", blocks=blocks))
    assert (choice.replica, choice.kind, choice.matched_blocks) == (B, PRECISE, 2)


def test_precise_kv_without_the_prompt_blocks_is_prefix_affinity():
    facts = RoutingFacts(affinity="c", prefix="p")
    assert PreciseKv().choose(ABC, {"a": 1}, facts) == PrefixAffinity().choose(ABC, {"a": 1}, facts)
    assert PreciseKv().choose(ABC, {"a": 1}, facts).replica == C


def test_precise_kv_with_no_holder_among_reporting_replicas_is_least_loaded():
    blocks = PromptBlocks((1,), {"a": frozenset(), "b": frozenset({9}), "c": frozenset()})
    choice = PreciseKv().choose(ABC, {"a": 3, "b": 2}, RoutingFacts(affinity="a", prefix="p", blocks=blocks))
    assert (choice.replica, choice.kind) == (C, LEAST_LOADED)


def _random_case(rng: random.Random) -> tuple[tuple[ReplicaRoute, ...], dict[str, int], RoutingFacts]:
    replicas = tuple(ReplicaRoute(replica_id=f"r{i}", node_id="n", base_url=f"http://r{i}")
                     for i in range(rng.randint(1, 5)))
    ids = [r.replica_id for r in replicas]
    load = {i: rng.randint(0, 10) for i in ids if rng.random() < 0.7}
    held = {i: (None if rng.random() < 0.3 else frozenset(rng.sample(range(6), rng.randint(0, 4)))) for i in ids}
    blocks = PromptBlocks(tuple(range(rng.randint(0, 4))), held) if rng.random() < 0.6 else None
    facts = RoutingFacts(affinity=rng.choice([None, *ids]), ejected={i: 20.0 for i in ids if rng.random() < 0.3},
                         now=rng.choice([10.0, 30.0]), exclude=frozenset(i for i in ids if rng.random() < 0.2),
                         saturation=rng.randint(1, 8), rotation=rng.randint(0, 9), prefix=rng.choice([None, "p"]),
                         blocks=blocks)
    return replicas, load, facts


def test_each_policy_decides_as_the_pure_choice_functions_the_gateway_used_before():
    """What `open_upstream` decided before the policies were classes, for 3,000 random states: round robin is
    `choose_replica` with no load; least loaded and prefix affinity are `choose_replica` (with the affinity only
    for a prompt with a prefix key, which only the prefix policy works out); precise is `choose_by_blocks` when the
    request has its blocks."""
    rng = random.Random(24)
    for _ in range(3000):
        replicas, load, facts = _random_case(rng)
        plain = replace(facts, affinity=None, prefix=None, blocks=None)  # a policy that ignores prefixes
        assert RoundRobin().choose(replicas, load, plain).replica == choose_replica(replicas, {}, plain)
        assert LeastLoaded().choose(replicas, load, plain).replica == choose_replica(replicas, load, plain)
        approximate = replace(facts, blocks=None)
        if approximate.prefix is None:
            approximate = replace(approximate, affinity=None)  # no prefix key: the balancer gives no affinity
        expected = choose_replica(replicas, load, approximate)
        assert PrefixAffinity().choose(replicas, load, approximate).replica == expected
        assert PreciseKv().choose(replicas, load, approximate).replica == expected
        if facts.blocks is not None:
            assert PreciseKv().choose(replicas, load, facts) == choose_by_blocks(
                replicas, load, facts.blocks.held, facts.blocks.blocks, facts)


def test_the_balancer_gives_each_try_its_facts_and_the_next_rotation():
    balancer = Balancer(saturation=3)
    balancer.eject("a", 0.0)
    first = balancer.facts(ABC, 1.0)
    second = balancer.facts(ABC, 2.0, frozenset({"b"}), "p")
    assert (first.rotation + 1, first.affinity, first.prefix) == (second.rotation, None, None)
    assert (second.now, second.exclude, second.saturation, second.ejected) == (2.0, {"b"}, 3, {"a": 10.0})
    balancer.remember("p", C)
    assert balancer.facts(ABC, 3.0, prefix="p").affinity == "c"
    assert balancer.facts(ABC, 3.0, prefix=None).affinity is None
