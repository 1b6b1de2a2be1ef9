"""Cordoned, drained and lent nodes (llmgw.plan.cordons): no new replica goes there, and a drained or lent node's
replicas are placed elsewhere before they stop. A node whose inlet is above serving.max_inlet_celsius is closed
too (tests/plan/test_inlet_limit.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType

import pytest
from plan_fleets import GiB, apply_plan, cpu_node, fleet, gpu_node, model, settings, shard

from llmgw.plan import ActionKind, make_plan
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings

GEMMA = model("gemma", cores=2, memory=2 * GiB)


def with_nodes(s, *, cordoned=(), drained=(), lent=()):
    slurm = SlurmSettings(controller="node01", nodes=MappingProxyType({n: SlurmNode("p", lent=True) for n in lent}),
                          partitions=MappingProxyType({"p": SlurmPartition()}))
    return replace(s, cluster=replace(s.cluster, cordoned=tuple(cordoned), drained=tuple(drained)), slurm=slurm)


def kinds(plan, kind):
    return {(a.node_id, a.replica_id) for a in plan.actions if a.kind is kind}


@pytest.mark.parametrize(("key", "word"), [("cordoned", "cordoned"), ("drained", "drained"), ("lent", "lent to Slurm")])
def test_no_new_replica_goes_to_a_closed_node_and_the_reason_says_so(key: str, word: str) -> None:
    s = with_nodes(settings(GEMMA), **{key: ["node01"]})
    plan = make_plan(s, fleet(cpu_node("node01", cores=16)))
    assert not kinds(plan, ActionKind.START)
    [unplaced] = plan.unplaced
    assert dict(unplaced.reasons)["node01"].startswith(word)
    assert kinds(make_plan(s, fleet(cpu_node("node01", cores=16), cpu_node("node02", cores=2))),
                 ActionKind.START) == {("node02", "gemma-0")}


def test_a_cordoned_node_keeps_the_replicas_it_runs() -> None:
    s = with_nodes(settings(GEMMA), cordoned=["node01"])
    plan = make_plan(s, fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]), cpu_node("node02")))
    assert kinds(plan, ActionKind.KEEP) == {("node01", "gemma-0")} and not kinds(plan, ActionKind.START)


@pytest.mark.parametrize("key", ["drained", "lent"])
def test_a_drained_or_lent_node_replica_is_placed_elsewhere_first_then_stopped(key: str) -> None:
    s = with_nodes(settings(GEMMA), **{key: ["node01"]})
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]), cpu_node("node02"))
    first = make_plan(s, f)
    assert kinds(first, ActionKind.START) == {("node02", "gemma-0")}
    [kept] = [a for a in first.actions if a.kind is ActionKind.KEEP]
    assert kept.node_id == "node01" and "kept until" in kept.reason
    assert not kinds(first, ActionKind.STOP)
    second = make_plan(s, apply_plan(first, f))
    assert kinds(second, ActionKind.STOP) == {("node01", "gemma-0")}
    assert kinds(second, ActionKind.KEEP) == {("node02", "gemma-0")}


def test_a_drained_node_with_no_room_elsewhere_keeps_serving() -> None:
    s = with_nodes(settings(GEMMA), drained=["node01"])
    plan = make_plan(s, fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]), cpu_node("node02", cores=1)))
    assert kinds(plan, ActionKind.KEEP) == {("node01", "gemma-0")} and not kinds(plan, ActionKind.STOP)
    assert "drained" in dict(plan.unplaced[0].reasons)["node01"]


def test_a_lent_node_stops_its_replica_even_with_no_room_elsewhere() -> None:
    s = with_nodes(settings(GEMMA), lent=["node01"])
    plan = make_plan(s, fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]), cpu_node("node02", cores=1)))
    [stop] = [a for a in plan.actions if a.kind is ActionKind.STOP]
    assert stop.node_id == "node01" and "lent to Slurm" in stop.reason and "no room elsewhere" in stop.reason
    assert not kinds(plan, ActionKind.KEEP)


@pytest.mark.parametrize("seed", range(40))
def test_placement_never_starts_a_replica_on_a_closed_node(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [gpu_node(f"node0{i}", count=rng.randint(1, 8)) if rng.random() < 0.5 else cpu_node(f"node0{i}", cores=8)
             for i in range(rng.randint(1, 8))]
    models = [model("gemma", replicas=rng.randint(1, 6), cores=2, memory=2 * GiB),
              model("big", replicas=rng.randint(0, 4), gpus=rng.randint(1, 4), gpu_class="h100-80g")]
    ids = [n.node_id for n in nodes]
    closed = {key: [i for i in ids if rng.random() < 0.3] for key in ("cordoned", "drained", "lent")}
    hot = {i for i in ids if rng.random() < 0.3}  # inlet above serving.max_inlet_celsius (issue 42)
    nodes = [replace(n, inlet_too_hot="board inlet above serving.max_inlet_celsius (35 °C)") if n.node_id in hot
             else n for n in nodes]
    s = with_nodes(settings(*models), **closed)
    plan = make_plan(s, fleet(*nodes))
    shut = set().union(*closed.values()) | hot
    for action in plan.actions:
        if action.kind in (ActionKind.START, ActionKind.INSTALL):
            assert action.node_id not in shut, action


def test_a_reclaimed_node_takes_replicas_only_once_its_last_slurm_job_step_ended() -> None:
    reclaimed = replace(with_nodes(settings(GEMMA)), slurm=SlurmSettings(
        controller="node01", nodes=MappingProxyType({"node01": SlurmNode("p", lent=False)}),
        partitions=MappingProxyType({"p": SlurmPartition()})))
    busy = cpu_node("node01", cores=16)
    plan = make_plan(reclaimed, fleet(replace(busy, slurm_job_steps=2)))
    assert not kinds(plan, ActionKind.START)
    [unplaced] = plan.unplaced
    assert dict(unplaced.reasons)["node01"] == (
        "being reclaimed from Slurm: drained there, waiting for its last 2 job step(s) to end")  # the progress
    assert kinds(make_plan(reclaimed, fleet(busy)), ActionKind.START) == {("node01", "gemma-0")}
    # a node llmgw never lends keeps whatever Slurm says: its job steps are not llmgw's business
    assert kinds(make_plan(settings(GEMMA), fleet(replace(busy, slurm_job_steps=2))),
                 ActionKind.START) == {("node01", "gemma-0")}
