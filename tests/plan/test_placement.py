"""Where replicas go on fresh fleets, and why they cannot go anywhere: tables of fleets."""

from __future__ import annotations

import pytest
from plan_fleets import GiB, LLAMA, cpu_node, fleet, gpu_node, model, settings, shard

from llmgw.plan import ActionKind, make_plan
from llmgw.settings.model import AgentSettings, frozen_map

H100_TP2 = model("llama70b", gpus=2, gpu_class="h100-80g", tp=2)
H100_TP4 = model("big", gpus=4, gpu_class="h100-80g", tp=4, replicas=2)
MIG = "a100-80g-mig-3g.40gb"

# (case id, settings, fleet, {replica: node} placed, {replica: {node: substring of its reason}} unplaced)
CASES = [
    ("cpu model goes on the cpu node with room",
     settings(model("gemma", cores=2, memory=2 * GiB)),
     fleet(cpu_node("node01", cores=1), cpu_node("node02", cores=4)),
     {"gemma-0": "node02"},
     {}),
    ("cpu replicas spread over nodes",
     settings(model("gemma", replicas=3, cores=2, memory=2 * GiB)),
     fleet(cpu_node("node01"), cpu_node("node02"), cpu_node("node03")),
     {"gemma-0": "node01", "gemma-1": "node02", "gemma-2": "node03"},
     {}),
    ("cpu replicas pack when no other node has room",
     settings(model("gemma", replicas=2, cores=2, memory=2 * GiB)),
     fleet(cpu_node("node01", cores=8), cpu_node("node02", cores=1)),
     {"gemma-0": "node01", "gemma-1": "node01"},
     {}),
    ("cpu memory counts what other shards hold",
     settings(model("gemma", cores=1, memory=20 * GiB), model("other", cores=1, memory=20 * GiB)),
     fleet(cpu_node("node01", memory=32 * GiB,
                    shards=[shard(model("other", cores=1, memory=20 * GiB), 0)])),
     {"other-0": "node01"},
     {"gemma-0": {"node01": "12Gi of 20Gi memory free"}}),
    ("cpu cores refused with what is free",
     settings(model("gemma", cores=6)),
     fleet(cpu_node("node01", cores=4)),
     {},
     {"gemma-0": {"node01": "4 of 6 CPU cores free"}}),
    ("tensor parallel takes devices of one node",
     settings(H100_TP2),
     fleet(gpu_node("node01", foreign=(0, 1, 2, 3, 4, 5, 6)), gpu_node("node02")),
     {"llama70b-0": "node02"},
     {}),
    ("replica that needs more than any one node has is refused per node",
     settings(model("huge", gpus=2, gpu_class="h100-80g", tp=2)),
     fleet(gpu_node("node01", count=1), gpu_node("node02", foreign=(0, 1, 2, 3, 4, 5, 6)),
           gpu_node("node03", gpu_class="a100-80g")),
     {},
     {"huge-0": {"node01": "1 of 2 h100-80g free",
                 "node02": "1 of 2 h100-80g free (7 with foreign processes)",
                 "node03": "no h100-80g GPUs (has 8 x a100-80g)"}}),
    ("cards with foreign processes are never chosen",
     settings(model("m", gpus=1, gpu_class="h100-80g")),
     fleet(gpu_node("node01", count=2, foreign=(0,))),
     {"m-0": ("node01", ("1",))},
     {}),
    ("gpu memory per device is required",
     settings(model("m", gpus=1, gpu_class="h100-80g", gpu_memory=60 * GiB)),
     fleet(gpu_node("node01", free=40 * GiB), gpu_node("node02", free=70 * GiB)),
     {"m-0": "node02"},
     {}),
    ("gpu memory shortfall is a reason",
     settings(model("m", gpus=1, gpu_class="h100-80g", gpu_memory=60 * GiB)),
     fleet(gpu_node("node01", count=2, free=40 * GiB)),
     {},
     {"m-0": {"node01": "0 of 1 h100-80g free (2 with less than 60Gi memory free)"}}),
    ("one mig instance per replica",
     settings(model("small", gpus=1, gpu_class=MIG, replicas=2)),
     fleet(gpu_node("node01", count=2, gpu_class=MIG, mig=True)),
     {"small-0": ("node01", ("MIG-node01-0",)), "small-1": ("node01", ("MIG-node01-1",))},
     {}),
    ("tensor parallel on a mig class is refused with a reason",
     settings(model("small", gpus=2, gpu_class=MIG, tp=2)),
     fleet(gpu_node("node01", count=7, gpu_class=MIG, mig=True)),
     {},
     {"small-0": {"all nodes": "a MIG instance is exactly one device"}}),
    ("pipeline parallel on a mig class is refused with a reason",
     settings(model("small", gpus=1, gpu_class=MIG, pp=2)),
     fleet(gpu_node("node01", count=7, gpu_class=MIG, mig=True)),
     {},
     {"small-0": {"all nodes": "pipeline_parallel 2"}}),
    ("node selector picks labelled nodes",
     settings(model("m", cores=1, selector={"zone": "b"})),
     fleet(cpu_node("node01", labels={"zone": "a"}), cpu_node("node02", labels={"zone": "b"})),
     {"m-0": "node02"},
     {}),
    ("labels from agent settings count as node labels",
     settings(model("m", cores=1, selector={"zone": "b"}),
              node_agents={"node01": AgentSettings(labels=frozen_map({"zone": "b"}))}),
     fleet(cpu_node("node01"), cpu_node("node02", labels={"zone": "a"})),
     {"m-0": "node01"},
     {}),
    ("no node has the labels",
     settings(model("m", cores=1, selector={"zone": "c"})),
     fleet(cpu_node("node01", labels={"zone": "a"})),
     {},
     {"m-0": {"node01": "labels do not match node_selector zone=c"}}),
    ("gpus ignored by agent settings are left alone",
     settings(model("m", gpus=1, gpu_class="h100-80g"),
              node_agents={"node01": AgentSettings(ignore_gpus=("0",))}),
     fleet(gpu_node("node01", count=2)),
     {"m-0": ("node01", ("1",))},
     {}),
    ("lost nodes are ignored",
     settings(model("m", cores=1)),
     fleet(cpu_node("node01", alive=False), cpu_node("node02")),
     {"m-0": "node02"},
     {}),
    ("a lost node is named in the reasons",
     settings(model("m", cores=16)),
     fleet(cpu_node("node01", alive=False), cpu_node("node02")),
     {},
     {"m-0": {"node01": "lost (no heartbeat)", "node02": "8 of 16 CPU cores free"}}),
    ("engine missing everywhere: install on a node that can host it and wait",
     settings(model("m", cores=4)),
     fleet(cpu_node("node01", cores=2, engines=()), cpu_node("node02", engines=())),
     {},
     {"m-0": {"node01": "2 of 4 CPU cores free", "node02": "installing llama.cpp b11434"}}),
    ("engine being installed: the replica waits and names it",
     settings(model("m", cores=1)),
     fleet(cpu_node("node01", engines=(), installing=(LLAMA,))),
     {},
     {"m-0": {"node01": "installing llama.cpp b11434"}}),
    ("a node with the engine is preferred to an install",
     settings(model("m", cores=1)),
     fleet(cpu_node("node01", engines=()), cpu_node("node02")),
     {"m-0": "node02"},
     {}),
    ("endpoint models run no engine",
     settings(model("ext", endpoints=("https://api.example.com",))),
     fleet(cpu_node("node01")),
     {},
     {}),
    ("replicas 0 places none",
     settings(model("m", replicas=0), model("n")),
     fleet(cpu_node("node01")),
     {"n-0": "node01"},
     {}),
]


@pytest.mark.parametrize("case_id, s, f, placed, unplaced", CASES, ids=[c[0] for c in CASES])
def test_replicas_are_placed_as_the_table_says(case_id, s, f, placed, unplaced):
    plan = make_plan(s, f)
    got = {a.replica_id: a for a in plan.assignments}
    assert set(got) == set(placed), plan
    for replica, where in placed.items():
        node, devices = where if isinstance(where, tuple) else (where, None)
        assert got[replica].node_id == node
        if devices is not None:
            assert got[replica].devices == devices
    assert {u.replica_id for u in plan.unplaced} == set(unplaced)
    for item in plan.unplaced:
        reasons = dict(item.reasons)
        for node, text in unplaced[item.replica_id].items():
            assert text in reasons[node], (node, reasons)


def test_every_start_carries_its_assignment_and_a_plain_shard_id():
    plan = make_plan(settings(H100_TP4), fleet(gpu_node("node01"), gpu_node("node02")))
    starts = [a for a in plan.actions if a.kind is ActionKind.START]
    assert [a.shard_id for a in starts] == ["big-0/0", "big-1/0"]
    assert {a.node_id for a in starts} == {"node01", "node02"}
    assert all(len(a.assignment.devices) == 4 for a in starts)


def test_tensor_parallel_prefers_one_numa_node_of_nvlink_peers():
    # node01: devices 0-3 on NUMA 0, 4-7 on NUMA 1; device 0 runs foreign work, so only NUMA 1 has four.
    plan = make_plan(settings(H100_TP4), fleet(gpu_node("node01", foreign=(0,))))
    (placed,) = plan.assignments
    assert placed.devices == ("4", "5", "6", "7")
    # With devices 0 and 5 busy, no NUMA node has four; one four-way replica still fits,
    plan = make_plan(settings(H100_TP4), fleet(gpu_node("node01", foreign=(0, 5))))
    assert len(plan.assignments) == 1
    # with room for only one four-way replica, the second one is refused with counts.
    assert plan.unplaced[0].reasons == (
        ("node01", "2 of 4 h100-80g free (4 held by shards, 2 with foreign processes)"),)


def test_tensor_parallel_stays_within_one_numa_node_when_it_can():
    two = model("pair", gpus=2, gpu_class="h100-80g", tp=2, replicas=2)
    # Devices 3 (NUMA 0) and 4 (NUMA 1) free alone would cross; 0..2 and 5..7 busy except 2, 3 and 6, 7.
    plan = make_plan(settings(two), fleet(gpu_node("node01", foreign=(0, 1, 4, 5))))
    devices = sorted(a.devices for a in plan.assignments)
    assert devices == [("2", "3"), ("6", "7")]


def test_an_install_is_planned_once_per_node_and_engine():
    s = settings(model("a", cores=1, replicas=2), model("b", cores=1))
    plan = make_plan(s, fleet(cpu_node("node01", engines=()), cpu_node("node02", engines=())))
    installs = [(a.node_id, a.engine) for a in plan.actions if a.kind is ActionKind.INSTALL]
    assert installs == [("node01", LLAMA), ("node02", LLAMA)]
    assert {u.replica_id for u in plan.unplaced} == {"a-0", "a-1", "b-0"}


def test_reasons_are_grouped_when_many_nodes_share_them():
    nodes = [cpu_node(f"node{i:03d}", cores=1) for i in range(40)]
    plan = make_plan(settings(model("m", cores=2)), fleet(*nodes))
    (item,) = plan.unplaced
    assert item.reasons == (("node000 and 39 other nodes", "1 of 2 CPU cores free"),)


def test_an_engine_version_missing_from_engines_yaml_is_not_installed_anywhere():
    s = settings(model("m", cores=1, version="b99999"))
    plan = make_plan(s, fleet(cpu_node("node01")))
    assert not [a for a in plan.actions if a.kind is ActionKind.INSTALL]
    assert plan.unplaced[0].reasons == (
        ("node01", "llama.cpp b99999 is not installed and engines.yaml does not list it"),)


def test_an_engine_version_installed_by_hand_is_used_even_if_engines_yaml_lacks_it():
    s = settings(model("m", cores=1, version="b99999"))
    plan = make_plan(s, fleet(cpu_node("node01", engines=("llama.cpp@b99999",))))
    assert [a.node_id for a in plan.assignments] == ["node01"]


def test_tensor_parallel_takes_nvlink_peers_over_device_order():
    from llmgw.plan import GpuState, NodeState

    pairs = {"0": ("1",), "1": ("0",), "2": ("3",), "3": ("2",)}
    gpus = tuple(GpuState(d, "l40s-48g", 48 * GiB, 48 * GiB, foreign_processes=(d == "0"), nvlink_peers=pairs[d])
                 for d in "0123")
    node = NodeState("node01", cpu_cores=32, memory_bytes=256 * GiB, gpus=gpus, engines_installed=frozenset({LLAMA}))
    plan = make_plan(settings(model("m", gpus=2, gpu_class="l40s-48g", tp=2)), fleet(node))
    assert plan.assignments[0].devices == ("2", "3")


def test_a_replica_waiting_for_an_install_names_the_install_even_when_it_fills_the_node():
    s = settings(model("m", gpus=8, gpu_class="h100-80g", tp=8))
    plan = make_plan(s, fleet(gpu_node("node01", engines=()), gpu_node("node02", engines=(), foreign=(3,))))
    assert [(a.kind, a.node_id) for a in plan.actions] == [(ActionKind.INSTALL, "node01")]
    assert plan.unplaced[0].reasons == (("node01", "installing llama.cpp b11434"),
                                        ("node02", "7 of 8 h100-80g free (1 with foreign processes)"))
    # Next pass, while it installs: the same reasons, no second install.
    from dataclasses import replace
    installing = fleet(replace(gpu_node("node01", engines=()), engines_installing=frozenset({LLAMA})),
                       gpu_node("node02", engines=(), foreign=(3,)))
    again = make_plan(s, installing)
    assert not again.actions and again.unplaced == plan.unplaced
