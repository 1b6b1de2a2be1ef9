"""The gateway's canary split: a route with a `canary_share` sends exactly that share of its requests to its canary
replicas, evenly spread; the routing table carries the split to gateway worker processes."""

from __future__ import annotations

import math

import pytest

from llmgw.gateway.feed import table_from_json, table_to_json
from llmgw.gateway.routing import Balancer, canary_pool, canary_turn
from llmgw.routes import ModelRoute, ReplicaRoute, RouteTable

OLD = (ReplicaRoute("m-0", "n1", "http://10.0.0.1:9000"), ReplicaRoute("m-1", "n1", "http://10.0.0.1:9001"))
CANARY = ReplicaRoute("m-0@canary", "n1", "http://10.0.0.1:9002", canary=True)


@pytest.mark.parametrize("share", [0.0, 0.01, 0.05, 0.1, 0.25, 1 / 3, 0.5, 0.7, 0.9, 1.0])
def test_of_the_first_n_requests_exactly_floor_n_times_the_share_go_to_the_canary(share):
    turns = [canary_turn(n, share) for n in range(1000)]
    for n in (1, 7, 10, 99, 100, 1000):
        assert sum(turns[:n]) == math.floor(n * share + 1e-9), (share, n)
    if 0 < share < 1:  # spread: never more than one canary request in a row below one half
        gaps = [b - a for a, b in zip(*(lambda t: (t, t[1:]))([n for n, turn in enumerate(turns) if turn]))]
        assert min(gaps) >= (2 if share <= 0.5 else 1)


def test_each_request_chooses_on_its_side_of_the_split():
    replicas = (*OLD, CANARY)
    assert canary_pool(replicas, None, True) == replicas  # no canary: everything
    assert canary_pool(replicas, 0.1, True) == [CANARY]
    assert canary_pool(replicas, 0.1, False) == list(OLD)
    assert canary_pool(OLD, 0.1, True) == OLD  # its side is empty (the canary not ready yet): everything


def test_the_balancer_counts_requests_per_model_and_splits_them():
    balancer = Balancer()
    route = ModelRoute("m", replicas=(*OLD, CANARY), canary_share=0.25)
    other = ModelRoute("o", replicas=OLD)
    pools = []
    for _ in range(8):
        pools.append(balancer.canary_pool(route))
        assert balancer.canary_pool(other) == OLD  # another model's requests count for nothing
    assert [pool == [CANARY] for pool in pools] == [False, False, False, True] * 2


def test_the_split_travels_to_gateway_workers_with_the_table():
    table = RouteTable(models={"m": ModelRoute("m", replicas=(*OLD, CANARY), canary_share=0.1),
                               "o": ModelRoute("o", replicas=OLD)})
    again = table_from_json(table_to_json(table))
    assert again.models["m"].canary_share == 0.1 and again.models["m"].replicas[2].canary
    assert again.models["o"].canary_share is None
    assert again == table
