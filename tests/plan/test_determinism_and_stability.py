"""The same inputs give the same plan, whatever the order; healthy replicas never move for a better packing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from plan_fleets import GiB, LLAMA, apply_plan, converge, cpu_node, fleet, gpu_node, model, settings, shard

from llmgw.plan import ActionKind, Fleet, ShardState, make_plan, plan_to_json
from llmgw.settings.model import frozen_map


def mixed_fleet(seed: int) -> tuple:
    """A fleet with H100 and A100-MIG nodes, CPU nodes, foreign cards, a lost node, labels and installs."""
    rng = random.Random(seed)
    nodes = []
    for i in range(12):
        nodes.append(gpu_node(f"gpu{i:02d}", foreign=tuple(rng.sample(range(8), rng.randint(0, 3))),
                              labels={"zone": rng.choice("ab")}, alive=rng.random() > 0.1,
                              engines=(LLAMA,) if rng.random() > 0.2 else ()))
    for i in range(3):
        nodes.append(gpu_node(f"mig{i:02d}", count=7, gpu_class="a100-80g-mig-1g.10gb", mig=True))
    for i in range(6):
        nodes.append(cpu_node(f"cpu{i:02d}", cores=rng.choice([4, 8, 16]), memory=rng.choice([16, 64]) * GiB))
    models = [
        model("tp8", gpus=8, gpu_class="h100-80g", tp=8, replicas=2),
        model("tp4", gpus=4, gpu_class="h100-80g", tp=4, replicas=3, selector={"zone": "a"}),
        model("tp2", gpus=2, gpu_class="h100-80g", tp=2, replicas=5),
        model("one", gpus=1, gpu_class="h100-80g", replicas=9),
        model("mig", gpus=1, gpu_class="a100-80g-mig-1g.10gb", replicas=12),
        model("cpu", cores=3, memory=6 * GiB, replicas=6),
        model("refused", gpus=2, gpu_class="a100-80g-mig-1g.10gb", tp=2),
    ]
    return settings(*models), fleet(*nodes)


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_does_not_depend_on_node_order(seed):
    s, f = mixed_fleet(seed)
    expected = plan_to_json(make_plan(s, f))
    assert expected["actions"] and expected["unplaced"]
    rng = random.Random(1000 + seed)
    for _ in range(5):
        nodes = list(f.nodes)
        rng.shuffle(nodes)
        shuffled = Fleet(tuple(replace(n, gpus=tuple(rng.sample(n.gpus, len(n.gpus)))) for n in nodes))
        assert plan_to_json(make_plan(s, shuffled)) == expected


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_does_not_depend_on_catalog_or_shard_order(seed):
    s, f = mixed_fleet(seed)
    f = converge(s, f)
    s2 = replace(s, models=frozen_map(dict(reversed(list(s.models.items())))))
    f2 = Fleet(tuple(replace(n, shards=tuple(reversed(n.shards))) for n in f.nodes))
    assert plan_to_json(make_plan(s2, f2)) == plan_to_json(make_plan(s, f))


@pytest.mark.parametrize("seed", range(4))
def test_a_converged_fleet_plans_no_changes(seed):
    s, f = mixed_fleet(seed)
    for _ in range(3):  # installs, then starts
        f = converge(s, f)
    plan = make_plan(s, f)
    assert not plan.changes, [a for a in plan.actions if a.kind is not ActionKind.KEEP]
    assert {a.kind for a in plan.actions} == {ActionKind.KEEP}


def test_healthy_replicas_stay_put_when_a_better_packing_appears():
    # Two one-GPU replicas landed on two nodes because node01 was busy with foreign work then.
    one = model("one", gpus=1, gpu_class="h100-80g", replicas=2)
    s = settings(one)
    f = fleet(gpu_node("node01", count=2, shards=[shard(one, 0, devices=("0",))]),
              gpu_node("node02", count=2, shards=[shard(one, 1, devices=("1",), state=ShardState.STARTING)]))
    # Packing both onto node01 would free node02 entirely: the planner still keeps both where they are.
    plan = make_plan(s, f)
    assert [(a.kind, a.node_id) for a in plan.actions] == [(ActionKind.KEEP, "node01"), (ActionKind.KEEP, "node02")]
    # A new, bigger model that needs a whole node waits rather than moving them.
    big = model("big", gpus=2, gpu_class="h100-80g", tp=2)
    plan = make_plan(settings(one, big), f)
    assert not [a for a in plan.actions if a.kind is not ActionKind.KEEP]
    assert [u.replica_id for u in plan.unplaced] == ["big-0"]


def test_existing_placements_survive_the_arrival_of_new_nodes():
    s, f = mixed_fleet(3)
    s = replace(s, models=frozen_map({**s.models, "tp8": replace(s.models["tp8"], replicas=14)}))
    for _ in range(3):
        f = converge(s, f)
    assert any(u.model == "tp8" for u in make_plan(s, f).unplaced)
    before = {a.replica_id: (a.node_id, a.devices) for a in make_plan(s, f).assignments}
    bigger = Fleet(f.nodes + tuple(gpu_node(f"new{i}") for i in range(4)))
    plan = make_plan(s, bigger)
    after = {a.replica_id: (a.node_id, a.devices) for a in plan.assignments}
    assert all(after[r] == where for r, where in before.items())
    started = {a.replica_id for a in plan.actions if a.kind is ActionKind.START}
    assert started and not started & set(before)


def test_planning_twice_gives_equal_plans():
    s, f = mixed_fleet(5)
    assert make_plan(s, f) == make_plan(s, f)
    f2 = apply_plan(make_plan(s, f), f)
    assert make_plan(s, f2) == make_plan(s, f2)
