"""The replica choice: least outstanding, prefix affinity until saturated, ejection with cooldown."""

from __future__ import annotations

import pytest

from llmgw.gateway import Balancer, choose_replica, prefix_key
from llmgw.gateway.routing import RoutingFacts
from llmgw.routes import ReplicaRoute

A, B, C = (ReplicaRoute(replica_id=i, node_id="n", base_url=f"http://{i}") for i in ("a", "b", "c"))


@pytest.mark.parametrize(
    ("outstanding", "affinity", "ejected", "exclude", "expected"),
    [
        ({}, None, {}, frozenset(), "a"),                                   # all idle: first in order
        ({"a": 2, "b": 1, "c": 3}, None, {}, frozenset(), "b"),             # least outstanding
        ({"a": 2, "b": 1}, "a", {}, frozenset(), "a"),                      # affinity wins below saturation
        ({"a": 8, "b": 0}, "a", {}, frozenset(), "b"),                      # affinity replica saturated (8)
        ({"a": 3}, "a", {"a": 100.0}, frozenset(), "b"),                    # ejected replica skipped
        ({"b": 1, "c": 1}, None, {"a": 5.0}, frozenset(), "a"),             # a's cooldown ended at 5 < now
        ({}, None, {"a": 100.0, "b": 100.0, "c": 100.0}, frozenset(), "a"),  # all ejected: try anyway
        ({}, "a", {}, frozenset({"a"}), "b"),                               # retry excludes the failed replica
        ({}, None, {}, frozenset({"a", "b", "c"}), None),                   # nothing left
    ],
)
def test_choice_follows_load_affinity_and_ejection(outstanding, affinity, ejected, exclude, expected):
    now = 10.0
    chosen = choose_replica([A, B, C], outstanding, RoutingFacts(affinity=affinity, ejected=ejected, now=now,
                                                                 exclude=exclude, saturation=8))
    assert (chosen.replica_id if chosen else None) == expected


def test_ties_rotate_so_idle_replicas_share_the_load():
    picks = {choose_replica([A, B, C], {}, RoutingFacts(rotation=r)).replica_id for r in range(3)}
    assert picks == {"a", "b", "c"}


def test_prefix_sticks_to_the_replica_that_served_it_until_saturated():
    balancer = Balancer(saturation=2)
    first = balancer.choose([A, B], "p1", now=0.0)
    balancer.started(first.replica_id)
    assert balancer.choose([A, B], "p1", now=0.0) == first          # 1 outstanding < 2: sticky
    balancer.started(first.replica_id)
    other = balancer.choose([A, B], "p1", now=0.0)                   # 2 outstanding: saturated
    assert other != first
    assert balancer.choose([A, B], "p1", now=0.0) == other           # the prefix moved with it
    balancer.finished(first.replica_id)
    balancer.finished(first.replica_id)
    assert balancer.outstanding == {}


def test_ejected_replica_returns_after_cooldown_or_health_check():
    balancer = Balancer(cooldown=10.0)
    balancer.eject("a", now=0.0)
    assert balancer.choose([A, B], None, now=5.0) == B
    assert balancer.is_ejected("a", 5.0) and not balancer.is_ejected("a", 10.5)
    balancer.readmit("a")
    assert not balancer.is_ejected("a", 5.0)


def test_prefix_key_depends_on_leading_text_and_model_only():
    long = "x" * 1000
    one = prefix_key("m", {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "a"}]})
    two = prefix_key("m", {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "b"}]})
    assert one == two
    assert prefix_key("other", {"messages": [{"role": "system", "content": long}]}) != one
    assert prefix_key("m", {"prompt": "hello"}) != prefix_key("m", {"prompt": "goodbye"})
    assert prefix_key("m", {"input": [1, 2, 3]}) is None
