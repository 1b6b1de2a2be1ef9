"""Multi-node placement (llmgw.plan.multinode): the order of preference on hand-made fleets, and its invariants on
60 seeded random fleets with NVLink domains, InfiniBand fabrics and leaves: never across two physical fabrics,
never on a node with an unjoined card (or IMEX down) for an NVLink-domain placement, a reason for every refusal."""

from __future__ import annotations

import random

import pytest

from llmgw.plan.multinode import NodeOffer, place_multinode, split_over_nodes

FABRIC_A = "0010e0406d5aa0a0"
FABRIC_B = "0010e0406d5aa0ff"
EIGHT = tuple(str(i) for i in range(8))


def ib_node(node_id: str, leaf: str, fabric: str = FABRIC_A, free=EIGHT, rails: int = 1) -> NodeOffer:
    adapters = tuple((f"mlx5_{r}", fabric, f"{leaf}-r{r}" if rails > 1 else leaf) for r in range(rails))
    return NodeOffer(node_id, f"10.0.0.{node_id[-1]}", tuple(free), adapters=adapters)


def test_a_16_gpu_replica_goes_on_two_8_gpu_nodes_of_one_leaf():
    assert split_over_nodes(16, 8) == (2, 8)
    offers = [ib_node("n1", "leaf-1"), ib_node("n2", "leaf-2"), ib_node("n3", "leaf-1")]
    placed = place_multinode(offers, 2, 8)
    assert placed.via == "infiniband" and placed.aligned and placed.fabric == FABRIC_A
    assert [(s.rank, s.node_id, s.devices) for s in placed.shards] == [(0, "n1", EIGHT), (1, "n3", EIGHT)]
    assert placed.rendezvous == "10.0.0.1" and placed.shards[0].env == (("NCCL_IB_HCA", "mlx5_0"),)


def test_rails_aligned_nodes_are_preferred_to_nodes_of_mixed_leaves():
    offers = [ib_node("n1", "a", rails=2), ib_node("n2", "b", rails=2), ib_node("n3", "a", rails=2)]
    placed = place_multinode(offers, 2, 8)
    assert {s.node_id for s in placed.shards} == {"n1", "n3"} and placed.aligned
    assert placed.shards[0].env == (("NCCL_IB_HCA", "mlx5_0,mlx5_1"),)
    mixed = place_multinode(offers[:2], 2, 8)
    assert mixed.placed and not mixed.aligned


def test_one_nvlink_domain_comes_first_and_sets_mnnvl():
    domain = [NodeOffer(f"n{i}", f"10.0.1.{i}", EIGHT, "cluster-1", True, adapters=((
        "mlx5_0", FABRIC_A, "leaf"),)) for i in range(2)]
    placed = place_multinode(domain, 2, 8)
    assert placed.via == "nvlink" and placed.fabric == "cluster-1"
    assert all(s.env == (("NCCL_MNNVL_ENABLE", "1"),) for s in placed.shards)


def test_a_node_with_an_unjoined_card_is_not_used_for_nvlink_but_may_be_for_infiniband():
    offers = [NodeOffer("n1", "h1", EIGHT, "cluster-1", True),
              NodeOffer("n2", "h2", EIGHT, "cluster-1", False, "GPU 3 not joined to the NVLink fabric")]
    refused = place_multinode(offers, 2, 8)
    assert not refused.placed
    assert "not ready (GPU 3 not joined" in dict(refused.reasons)["n2"]
    with_ib = [NodeOffer(o.node_id, o.address, o.free, o.domain, o.domain_ready, o.domain_reason,
                         (("mlx5_0", FABRIC_A, "leaf"),)) for o in offers]
    assert place_multinode(with_ib, 2, 8).via == "infiniband"


def test_two_physical_fabrics_are_never_joined_and_each_node_says_why():
    offers = [ib_node("n1", "leaf", FABRIC_A), ib_node("n2", "leaf", FABRIC_B), ib_node("n3", "leaf", free=EIGHT[:4])]
    refused = place_multinode(offers, 2, 8)
    assert not refused.placed
    assert dict(refused.reasons) == {"n1": f"InfiniBand fabric {FABRIC_A} has 1 of 2 nodes",
                                     "n2": f"InfiniBand fabric {FABRIC_B} has 1 of 2 nodes",
                                     "n3": "4 of 8 GPUs free"}


@pytest.mark.parametrize("gpus, largest, nodes, expected", [
    (16, 8, None, (2, 8)), (8, 8, None, (1, 8)), (24, 8, None, (3, 8)), (12, 8, None, (2, 6)),
    (16, 8, 4, (4, 4)), (16, 8, 3, "16 GPUs cannot be split evenly over 3 nodes"),
    (7, 4, None, (7, 1)), (4, 0, None, "no split of 4 GPUs fits nodes with at most 0 free"),
])
def test_a_replica_is_split_evenly_over_as_few_nodes_as_fit(gpus, largest, nodes, expected):
    assert split_over_nodes(gpus, largest, nodes) == expected


def random_offers(rng: random.Random) -> list[NodeOffer]:
    offers = []
    for i in range(rng.choice([0, *range(2, 12)])):
        free = tuple(str(d) for d in range(rng.choice([0, 2, 4, 8, 8, 8])))
        domain = rng.choice([None, None, "cluster-1", "cluster-2"])
        ready = domain is not None and rng.random() < 0.7
        adapters = tuple((f"mlx5_{r}", rng.choice([FABRIC_A, FABRIC_A, FABRIC_B, ""]),
                          rng.choice(["l1", "l1", "l2", ""]))
                         for r in range(rng.choice([0, 1, 2, 2])))
        offers.append(NodeOffer(f"n{i:02d}", f"10.0.0.{i}", free, domain, ready,
                                "" if ready else "GPU 0 not joined", adapters))
    return offers


@pytest.mark.parametrize("seed", range(60))
def test_multinode_placement_invariants_on_random_fleets(seed):
    rng = random.Random(seed)
    offers = random_offers(rng)
    nodes, per_node = rng.choice([(2, 4), (2, 8), (3, 2), (4, 4)])
    placed = place_multinode(offers, nodes, per_node)
    by_id = {o.node_id: o for o in offers}
    assert placed == place_multinode(list(reversed(offers)), nodes, per_node)  # order does not matter
    if not placed.placed:
        assert {n for n, _ in placed.reasons} == (set(by_id) or {""})  # every node says why
        assert all(why for _, why in placed.reasons)
        return
    chosen = [by_id[s.node_id] for s in placed.shards]
    assert len({o.node_id for o in chosen}) == nodes == len(placed.shards)
    assert [s.rank for s in placed.shards] == list(range(nodes))
    for slot, offer in zip(placed.shards, chosen):
        assert len(slot.devices) == per_node and set(slot.devices) <= set(offer.free)
    if placed.via == "nvlink":
        assert all(o.domain == placed.fabric and o.domain_ready for o in chosen)
    else:
        assert placed.via == "infiniband"
        assert all(placed.fabric in o.fabrics() for o in chosen)  # one physical fabric, whatever the names
        for slot, offer in zip(placed.shards, chosen):
            hcas = dict(slot.env)["NCCL_IB_HCA"].split(",")
            assert hcas == [ca for ca, f, _ in offer.adapters if f == placed.fabric]
        if placed.aligned:
            assert len({o.leaves(placed.fabric) for o in chosen}) == 1
        # an NVLink domain with enough ready nodes would have been chosen first
        ready = {}
        for o in offers:
            if o.domain and o.domain_ready and len(o.free) >= per_node:
                ready[o.domain] = ready.get(o.domain, 0) + 1
        assert all(count < nodes for count in ready.values())


def test_offers_come_from_the_fleet_and_the_health_reports():
    from dataclasses import replace

    from plan_fleets import gpu_node, model, shard

    from llmgw.plan.multinode import interconnect_of, offers_for
    from llmgw.tools import DomainMembership, IbPort, NodeHealthReport

    m = model("m", gpus=2, gpu_class="h100-80g", tp=2)
    busy = gpu_node("node01", shards=[shard(m, 0, devices=("0", "1"))], foreign=(2,))
    ports = (IbPort("mlx5_0", 1, "Active", 400.0, "InfiniBand"), IbPort("mlx5_1", 1, "Down", None, "InfiniBand"))
    reports = {
        "node01": NodeHealthReport(ib_ports=ports, port_fabrics=(("mlx5_0", 1, FABRIC_A),)),
        "node02": NodeHealthReport(domain=DomainMembership("cluster-1"), imex=False),
    }
    nodes = [replace(n, interconnect=interconnect_of(reports.get(n.node_id), {("mlx5_0", 1): "leaf-7"}))
             for n in (busy, gpu_node("node02"), gpu_node("node03", alive=True))]
    one, two, three = offers_for(nodes, "h100-80g")
    assert one.free == ("3", "4", "5", "6", "7") and one.adapters == (("mlx5_0", FABRIC_A, "leaf-7"),)
    assert two.domain == "cluster-1" and not two.domain_ready and "IMEX" in two.domain_reason
    assert three.adapters == () and len(three.free) == 8
    refused = place_multinode([one, two, three], 2, 8)
    assert not refused.placed and "5 of 8 GPUs free" == dict(refused.reasons)["node01"]
