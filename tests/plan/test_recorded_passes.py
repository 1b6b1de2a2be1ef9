"""A pass's planning as recorded in its audit commit (`llmgw.plan.recorded`): the fleet comes back exactly, so the
plan made from it again is the same plan, on random fleets with every kind of node field set; equal fleets are
equal bytes; a record that was changed is refused naming where."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest
from plan_fleets import apply_plan
from test_invariants import random_case

from llmgw.errors import UsageError
from llmgw.plan import (
    Fleet, Interconnect, MemoryBandwidth, NodeState, ShardState, fleet_from_record, fleet_record, make_plan,
    pass_from_record, plan_digest, plan_or_refusal, recorded_files,
)
from llmgw.plan.recorded import FLEET_FILE, PASS_FILE


def varied(fleet: Fleet, rng: random.Random) -> Fleet:
    """`fleet` with the fields random_case leaves at their default set on some nodes (what the control plane's
    planner fleet carries: acknowledged agent settings, installable engines, features, interconnects, ranks)."""
    nodes = []
    for node in fleet.nodes:
        if rng.random() < 0.5:
            node = replace(node, agent_settings_applied=rng.choice(["", "ab12"]),
                           engines_installable=frozenset(rng.sample(["llama.cpp", "vllm", "sglang"], 2)),
                           features=frozenset({"kv-events"}) if rng.random() < 0.5 else None,
                           slurm_job_steps=rng.randint(0, 3),
                           interconnect=Interconnect("cluster-1", rng.random() < 0.5, "",
                                                     (("mlx5_0", "fabric-a", "leaf-1"),)),
                           shards=tuple(replace(s, rank=1, group="g") for s in node.shards))
        nodes.append(node)
    return Fleet(tuple(nodes))


@pytest.mark.parametrize("seed", range(30))
def test_a_recorded_fleet_comes_back_exactly_and_plans_the_same_plan(seed):
    settings, fleet = random_case(seed)
    rng = random.Random(seed)
    fleet = varied(apply_plan(make_plan(settings, fleet), fleet, state=ShardState.PENDING), rng)
    data = fleet_record(fleet)
    again = fleet_from_record(data)
    assert again == fleet
    assert fleet_record(again) == data, "equal fleets are equal bytes (one git blob)"
    known: dict = {}
    assert fleet_record(fleet, known) == data and fleet_record(again, known) == data, "per-node reuse, same bytes"
    if fleet.nodes:
        changed = Fleet((replace(fleet.nodes[0], cpu_cores=fleet.nodes[0].cpu_cores + 1), *fleet.nodes[1:]))
        assert fleet_record(changed, known) == fleet_record(changed) != data
    plan, _ = plan_or_refusal(settings, again, False)
    assert plan_digest(plan) == plan_digest(plan_or_refusal(settings, fleet, False)[0])
    files = recorded_files(7, settings, False, fleet, plan)
    planned = pass_from_record(files[PASS_FILE], files[FLEET_FILE])
    assert planned.number == 7 and planned.plan_digest == plan_digest(plan) and not planned.allow_empty


def test_plans_that_differ_in_any_field_have_different_digests():
    plan = next(p for p in (make_plan(*random_case(seed)) for seed in range(20)) if p.assignments)
    first = plan.assignments[0]
    moved = replace(plan, assignments=(replace(first, rank=first.rank + 1), *plan.assignments[1:]))
    assert plan_digest(moved) != plan_digest(plan)
    assert plan_digest(replace(plan, notes=("x",))) != plan_digest(plan)


@pytest.mark.parametrize(("edit", "where"), [
    (lambda text: text.replace('"node_id":"n00"', '"node_id":0'), "nodes[0]: expected str"),
    (lambda text: text.replace('"version":1', '"version":9'), "version 9 is not 1"),
    (lambda text: text.replace('"node_id":"n00"', '"node_id":"n00","colour":"red"'), "nodes[0]: unknown key 'colour' of NodeState"),
])
def test_a_changed_fleet_record_is_refused_naming_where(edit, where):
    _settings, fleet = random_case(0)
    with pytest.raises(UsageError, match=re.escape(f"audit commit 1234 is not a recorded fleet: {where}")):
        fleet_from_record(edit(fleet_record(fleet).decode()).encode(), "plan/fleet.json of audit commit 1234")


def test_a_pass_record_whose_fleet_file_was_replaced_is_refused():
    settings, fleet = random_case(1)
    files = recorded_files(1, settings, False, fleet, make_plan(settings, fleet))
    with pytest.raises(UsageError, match="changed by hand"):
        pass_from_record(files[PASS_FILE], fleet_record(Fleet(fleet.nodes[1:])))


def test_a_nodes_probed_bandwidth_is_recorded_with_the_fleet_and_read_back():
    probed = Fleet((NodeState("n1", memory_bandwidth=MemoryBandwidth(11.5e9, 31.7e9, 2, 0.5)), NodeState("n2")))
    data = fleet_record(probed)
    assert b'"memory_bandwidth":{"all_cores_bytes_per_second":31700000000.0' in data
    assert fleet_from_record(data) == probed
