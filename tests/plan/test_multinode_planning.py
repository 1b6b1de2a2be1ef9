"""The planner spreads a replica that needs more GPUs than one node has over several nodes (llmgw.plan.spanning):
one shard per node with its rank, the rendezvous address and the NCCL variables; the whole group is kept while every
rank runs and placed again as a whole when one is gone. Fleets are the H200 capture's shape (8 cards a node)."""

from __future__ import annotations

import random

import pytest
from dataclasses import replace

import plan_fleets
from plan_fleets import apply_plan, fleet, model

from llmgw.plan import ActionKind, Interconnect, ShardState, make_plan
from llmgw.plan.spanning import LLAMACPP_SPAN_REFUSAL, rendezvous_of
from llmgw.settings.model import EngineVersion, frozen_map

FABRIC_A = "0010e0406d5aa0a0"
FABRIC_B = "0010e0406d5aa0ff"
EIGHT = tuple(str(i) for i in range(8))
VLLM = "vllm@0.32.0"
BIG = model("big", gpus=16, gpu_class="h100-80g", tp=8, pp=2, engine="vllm", version="0.32.0")


def settings(*models):
    s = plan_fleets.settings(*models)
    return replace(s, engines=frozen_map({**s.engines, ("vllm", "0.32.0"): EngineVersion("vllm", "0.32.0")}))


def gpu_node(node_id: str, **kwargs):
    return plan_fleets.gpu_node(node_id, **{"engines": (VLLM,), **kwargs})


def on_leaf(node, leaf: str, fabric: str = FABRIC_A, rails: int = 1):
    adapters = tuple((f"mlx5_{r}", fabric, leaf) for r in range(rails))
    return replace(node, interconnect=Interconnect(adapters=adapters))


def starts(plan):
    return [a for a in plan.actions if a.kind is ActionKind.START]


def test_a_16_gpu_replica_is_started_on_two_8_gpu_nodes_of_one_leaf_with_ranks():
    s = settings(BIG)
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node2"), "leaf-2"),
              on_leaf(gpu_node("node3"), "leaf-1"))
    plan = make_plan(s, f)
    started = starts(plan)
    assert [(a.node_id, a.shard_id, a.assignment.rank, a.assignment.nodes, a.assignment.devices)
            for a in started] == [("node1", "big-0/0", 0, 2, EIGHT), ("node3", "big-0/1", 1, 2, EIGHT)]
    assert {a.assignment.rendezvous for a in started} == {rendezvous_of("10.0.0.1", "big-0/0")}
    assert rendezvous_of("10.0.0.1", "big-0/0").startswith("10.0.0.1:29") and {a.assignment.group for a in started} == {
        "big-0/0"}
    assert all(a.assignment.env == (("NCCL_IB_HCA", "mlx5_0"),) for a in started)
    assert "rank 1 of 2 over InfiniBand fabric " + FABRIC_A in started[1].reason
    assert not plan.unplaced


def test_one_nvlink_domain_is_preferred_and_its_shards_get_mnnvl():
    domain = Interconnect("cluster-1", True, adapters=(("mlx5_0", FABRIC_A, "leaf-1"),))
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node2"), "leaf-1"),
              replace(gpu_node("node3"), interconnect=domain), replace(gpu_node("node4"), interconnect=domain))
    started = starts(make_plan(settings(BIG), f))
    assert [a.node_id for a in started] == ["node3", "node4"]
    assert all(a.assignment.env == (("NCCL_MNNVL_ENABLE", "1"),) for a in started)


def test_a_running_group_is_kept_as_it_is():
    s = settings(BIG)
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node3"), "leaf-1"))
    running = apply_plan(make_plan(s, f), f)
    plan = make_plan(s, running)
    assert not plan.changes and not plan.unplaced
    keeps = [(a.node_id, a.assignment.rank, a.assignment.rendezvous) for a in plan.actions]
    assert keeps == [("node1", 0, rendezvous_of("10.0.0.1", "big-0/0")), ("node3", 1, rendezvous_of("10.0.0.1", "big-0/0"))]


def test_a_group_missing_a_rank_is_stopped_and_placed_again_as_a_whole():
    s = settings(BIG)
    f = fleet(*(on_leaf(gpu_node(f"node{i}"), "leaf-1") for i in (1, 2, 3)))
    running = apply_plan(make_plan(s, f), f)  # ranks on node1 and node2
    lost = fleet(*(replace(n, alive=False, shards=()) if n.node_id == "node2" else n for n in running.nodes))
    plan = make_plan(s, lost)
    stops = [(a.node_id, a.shard_id) for a in plan.actions if a.kind is ActionKind.STOP]
    assert stops == [("node1", "big-0/0")]
    assert "rank 1 of 2 is gone" in [a for a in plan.actions if a.kind is ActionKind.STOP][0].reason
    assert not starts(plan)  # rank 0 holds node1's cards until it has stopped
    again = make_plan(s, apply_plan(plan, lost))
    assert [(a.node_id, a.shard_id, a.assignment.rank) for a in starts(again)] == [
        ("node1", "big-0/0", 0), ("node3", "big-0/1", 1)]


def test_a_group_with_a_card_out_for_health_moves_off_that_node():
    s = settings(BIG)
    f = fleet(*(on_leaf(gpu_node(f"node{i}"), "leaf-1") for i in (1, 2, 3)))
    running = apply_plan(make_plan(s, f), f)
    node2 = running.node("node2")
    bad = replace(node2, gpus=tuple(replace(g, unhealthy="Xid 79: fallen off the bus") if g.device_id == "3" else g
                                    for g in node2.gpus))
    four = fleet(running.node("node1"), bad, running.node("node3"), on_leaf(gpu_node("node4"), "leaf-1"))
    plan = make_plan(s, four)
    assert not [a for a in plan.actions if a.kind is ActionKind.STOP]  # serves on until its replacement is ready
    assert [a.node_id for a in starts(plan)] == ["node3", "node4"]
    assert "node2: GPU 3 out for health" in starts(plan)[0].reason
    moved = make_plan(s, apply_plan(plan, four))
    assert {a.node_id for a in moved.actions if a.kind is ActionKind.STOP} == {"node1", "node2"}


def test_two_physical_fabrics_are_never_joined_and_every_node_says_why():
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1", FABRIC_A), on_leaf(gpu_node("node2"), "leaf-1", FABRIC_B),
              gpu_node("node3", foreign=(0, 1, 2, 3)))
    plan = make_plan(settings(BIG), f)
    assert not starts(plan)
    (unplaced,) = plan.unplaced
    reasons = dict(unplaced.reasons)
    assert reasons["node1"] == f"InfiniBand fabric {FABRIC_A} has 1 of 2 nodes"
    assert reasons["node2"] == f"InfiniBand fabric {FABRIC_B} has 1 of 2 nodes"
    assert reasons["node3"] == "4 of 8 GPUs free"
    assert "needs 2 nodes of 8 x h100-80g" in reasons["all nodes"]


def test_a_node_without_the_engine_installs_it_and_the_replica_waits():
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node2", engines=()), "leaf-1"))
    plan = make_plan(settings(BIG), f)
    assert [(a.kind, a.node_id) for a in plan.actions] == [(ActionKind.INSTALL, "node2")]
    assert plan.unplaced[0].reasons == (("node2", "installing vllm for rank 1"),)


def test_a_replica_that_fits_one_node_is_not_spread():
    eight = replace(BIG, name="eight", resources=replace(BIG.resources, gpus=8, pipeline_parallel=1))
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node2"), "leaf-1"))
    (start,) = starts(make_plan(settings(eight), f))
    assert start.shard_id == "eight-0/0" and start.assignment.nodes == 1 and start.assignment.rendezvous == ""


def test_a_spread_group_moves_onto_one_node_when_a_big_enough_node_joins():
    s = settings(BIG)
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node3"), "leaf-1"))
    running = apply_plan(make_plan(s, f), f)
    grown = fleet(*running.nodes, gpu_node("node9", count=16))
    plan = make_plan(s, grown)
    (start,) = starts(plan)
    assert start.node_id == "node9" and len(start.assignment.devices) == 16 and start.assignment.nodes == 1
    assert all(a.kind is ActionKind.KEEP for a in plan.actions if a.node_id != "node9")  # serves until ready
    done = apply_plan(plan, grown)
    final = make_plan(s, done)
    assert {(a.node_id, a.kind) for a in final.actions if a.kind is ActionKind.STOP} == {
        ("node1", ActionKind.STOP), ("node3", ActionKind.STOP)}


def test_a_new_generation_of_a_group_waits_for_every_rank_before_the_old_stops():
    s = settings(BIG)
    f = fleet(*(on_leaf(gpu_node(f"node{i}"), "leaf-1") for i in (1, 2, 3, 4)))
    running = apply_plan(make_plan(s, f), f)
    bumped = settings(replace(BIG, engine_args=("--new",)))
    plan = make_plan(bumped, running)
    assert [a.node_id for a in starts(plan)] == ["node3", "node4"]
    assert not [a for a in plan.actions if a.kind is ActionKind.STOP]
    half = apply_plan(plan, running, state=ShardState.STARTING)
    assert not [a for a in make_plan(bumped, half).actions if a.kind is ActionKind.STOP]
    ready = apply_plan(plan, running)
    stops = {a.node_id for a in make_plan(bumped, ready).actions if a.kind is ActionKind.STOP}
    assert stops == {"node1", "node2"}


def test_the_plan_does_not_depend_on_the_order_of_nodes():
    rng = random.Random(7)
    nodes = [on_leaf(gpu_node(f"node{i}"), rng.choice(["leaf-1", "leaf-2"]), rng.choice([FABRIC_A, FABRIC_B]))
             for i in range(1, 9)]
    s = settings(replace(BIG, replicas=3))
    first = make_plan(s, fleet(*nodes))
    rng.shuffle(nodes)
    assert make_plan(s, fleet(*nodes)) == first


def test_an_engine_without_a_multi_node_command_line_is_not_spread():
    sglang = model("sg", gpus=16, gpu_class="h100-80g", tp=16, engine="sglang")
    f = fleet(on_leaf(plan_fleets.gpu_node("node1"), "leaf-1"), on_leaf(plan_fleets.gpu_node("node2"), "leaf-1"))
    plan = make_plan(plan_fleets.settings(sglang), f)
    assert not starts(plan)
    assert dict(plan.unplaced[0].reasons)["node1"] == "8 of 16 h100-80g free"


def test_a_llama_cpp_replica_larger_than_a_node_is_refused_for_lack_of_rpc_servers():
    llama = model("llama", gpus=16, gpu_class="h100-80g", tp=16)
    f = fleet(on_leaf(plan_fleets.gpu_node("node1"), "leaf-1"), on_leaf(plan_fleets.gpu_node("node2"), "leaf-1"))
    plan = make_plan(plan_fleets.settings(llama), f)
    assert not starts(plan) and not [a for a in plan.actions if a.kind is ActionKind.INSTALL]
    assert plan.unplaced[0].reasons == (("all nodes", LLAMACPP_SPAN_REFUSAL), ("node1", "8 of 16 h100-80g free"),
                                        ("node2", "8 of 16 h100-80g free"))
    assert "-DGGML_RPC=ON" in LLAMACPP_SPAN_REFUSAL
    one_node = model("llama", gpus=8, gpu_class="h100-80g", tp=8)
    assert [a.node_id for a in starts(make_plan(plan_fleets.settings(one_node), f))] == ["node1"]


def random_fleet(rng: random.Random) -> list:
    nodes = []
    for i in range(rng.randrange(0, 10)):
        node = gpu_node(f"node{i}", count=rng.choice([4, 8, 8]), foreign=tuple(rng.sample(range(4), rng.choice([0, 0, 2]))),
                        alive=rng.random() < 0.9, engines=rng.choice([(VLLM,), (VLLM,), ()]))
        domain = rng.choice([None, None, "cluster-1"])
        adapters = tuple((f"mlx5_{r}", rng.choice([FABRIC_A, FABRIC_A, FABRIC_B]), rng.choice(["l1", "l2", ""]))
                         for r in range(rng.choice([0, 1, 2])))
        nodes.append(replace(node, interconnect=Interconnect(domain, domain is not None and rng.random() < 0.7,
                                                             "" if domain else "", adapters)))
    return nodes


@pytest.mark.parametrize("seed", range(60))
def test_spread_replicas_on_random_fleets_keep_their_invariants(seed):
    rng = random.Random(seed)
    nodes = random_fleet(rng)
    gpus = rng.choice([8, 12, 16, 24])
    s = settings(replace(BIG, replicas=rng.choice([1, 2]), resources=replace(BIG.resources, gpus=gpus,
                                                                              tensor_parallel=gpus, pipeline_parallel=1)))
    plan = make_plan(s, fleet(*nodes))
    assert plan == make_plan(s, fleet(*reversed(nodes)))  # the order of nodes does not matter
    by_id = {n.node_id: n for n in nodes}
    held: set[tuple[str, str]] = set()
    groups: dict[str, list] = {}
    for action in starts(plan):
        node = by_id[action.node_id]
        assert node.alive and VLLM in node.engines_installed
        for device in action.assignment.devices:
            assert (action.node_id, device) not in held  # no card given twice
            held.add((action.node_id, device))
            gpu = next(g for g in node.gpus if g.device_id == device)
            assert not gpu.foreign_processes and not gpu.unhealthy
        groups.setdefault(action.assignment.group or action.shard_id, []).append(action)
    for members in groups.values():
        first = members[0].assignment
        assert sorted(a.assignment.rank for a in members) == list(range(first.nodes))
        assert len({a.node_id for a in members}) == first.nodes
        assert sum(len(a.assignment.devices) for a in members) == gpus
        assert len({a.assignment.rendezvous for a in members}) == 1
        if first.nodes > 1:
            env = {k for a in members for k, _ in a.assignment.env}
            if env == {"NCCL_MNNVL_ENABLE"}:
                assert all(by_id[a.node_id].interconnect.domain_ready for a in members)
            else:  # one physical fabric: every shard's adapters are on one fabric id shared by all
                fabrics = [{f for _, f, _ in by_id[a.node_id].interconnect.adapters} for a in members]
                assert set.intersection(*fabrics)
    for unplaced in plan.unplaced:
        assert unplaced.reasons and all(why for _, why in unplaced.reasons)


def test_the_ranks_of_a_draining_group_hold_their_cards_until_they_stopped():
    """A spread replica's group told to stop drains first (its ranks STOPPING): no new group is placed on its
    cards before the ranks stopped."""
    s = settings(BIG)
    f = fleet(on_leaf(gpu_node("node1"), "leaf-1"), on_leaf(gpu_node("node2"), "leaf-1"))
    running = apply_plan(make_plan(s, f), f)
    draining = fleet(*(replace(n, shards=tuple(replace(x, state=ShardState.STOPPING) for x in n.shards))
                       for n in running.nodes))
    changed = settings(replace(BIG, context_size=8192))
    assert not starts(make_plan(changed, draining))
    stopped = fleet(*(replace(n, shards=()) for n in running.nodes))
    assert len(starts(make_plan(changed, stopped))) == 2
