"""Properties every plan keeps, on many random fleets and catalogs (seeded, so failures reproduce)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from plan_fleets import GiB, LLAMA, apply_plan, cpu_node, fleet, gpu_node, model, settings

from llmgw.plan import ActionKind, Fleet, Plan, ShardState, fingerprint, make_plan, replica_ids
from llmgw.settings.model import Settings, frozen_map

CLASSES = ("h100-80g", "a100-40g")


def random_case(seed: int) -> tuple[Settings, Fleet]:
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(1, 8)):
        if rng.random() < 0.7:
            nodes.append(gpu_node(
                f"n{i:02d}", count=rng.choice([1, 2, 4, 8]), gpu_class=rng.choice(CLASSES),
                free=rng.choice([30, 80]) * GiB, foreign=tuple(j for j in range(8) if rng.random() < 0.15),
                labels={"zone": rng.choice("ab")}, alive=rng.random() > 0.1,
                engines=(LLAMA,) if rng.random() > 0.3 else (), cpu_cores=rng.choice([4, 64])))
        else:
            nodes.append(cpu_node(f"n{i:02d}", cores=rng.choice([2, 4, 8]), memory=rng.choice([8, 32]) * GiB,
                                  labels={"zone": rng.choice("ab")}, alive=rng.random() > 0.1,
                                  engines=(LLAMA,) if rng.random() > 0.3 else ()))
    models = []
    for m in range(rng.randint(1, 6)):
        gpus = rng.choice([0, 0, 1, 2, 4, 8])
        models.append(model(
            f"m{m}", replicas=rng.randint(0, 4), gpus=gpus, gpu_class=rng.choice(CLASSES) if gpus else None,
            tp=max(gpus, 1), cores=rng.choice([1, 2, 3]), memory=rng.choice([1, 4, 16]) * GiB,
            gpu_memory=rng.choice([None, 40 * GiB]), selector={"zone": "a"} if rng.random() < 0.2 else None))
    return settings(*models), fleet(*nodes)


def check_plan(s: Settings, f: Fleet, plan: Plan) -> None:
    nodes = {n.node_id: n for n in f.nodes}
    wanted = [r for m in s.models.values() for r in replica_ids(m)]
    placed = [a.replica_id for a in plan.assignments]
    waiting = [u.replica_id for u in plan.unplaced]
    assert sorted(placed + waiting) == sorted(wanted), "every replica is placed or unplaced, once"
    used: dict[str, set[str]] = {}
    cores: dict[str, float] = {}
    for a in plan.assignments:
        node = nodes[a.node_id]
        m = s.models[a.model]
        assert node.alive
        assert len(a.devices) == m.resources.gpus
        assert all(dict(node.labels).get(k) == v for k, v in m.node_selector.items())
        gpus = {g.device_id: g for g in node.gpus}
        for device in a.devices:
            assert device not in used.setdefault(a.node_id, set()), "a device is given once"
            used[a.node_id].add(device)
            assert gpus[device].gpu_class == m.resources.gpu_class and not gpus[device].foreign_processes
            assert gpus[device].memory_free_bytes >= (m.resources.gpu_memory_bytes or 0)
        cores[a.node_id] = cores.get(a.node_id, 0.0) + a.cpu_cores
    for node_id, total in cores.items():
        assert total <= nodes[node_id].cpu_cores + 1e-9
    for action in plan.actions:
        if action.kind is ActionKind.START:
            assert LLAMA in nodes[action.node_id].engines_installed
        if action.kind is ActionKind.INSTALL:
            assert nodes[action.node_id].alive and action.engine not in nodes[action.node_id].engines_installed


def settle(s: Settings, f: Fleet, passes: int = 8) -> Fleet:
    for _ in range(passes):
        plan = make_plan(s, f)
        check_plan(s, f, plan)
        if not plan.changes:
            return f
        f = apply_plan(plan, f)
    raise AssertionError(f"no fixpoint after {passes} passes: {make_plan(s, f)}")


@pytest.mark.parametrize("seed", range(60))
def test_random_fleets_converge_without_breaking_any_constraint(seed):
    s, f = random_case(seed)
    f = settle(s, f)
    # Roll every model (new engine arguments) and scale one: it converges again, with the new fingerprints only.
    rng = random.Random(seed)
    models = {name: replace(m, engine_args=("--seed", str(seed)),
                            replicas=m.replicas + (1 if rng.random() < 0.3 else 0)) for name, m in s.models.items()}
    s2 = replace(s, models=frozen_map(models))
    f = settle(s2, f, passes=12)
    plan = make_plan(s2, f)
    current = {a.replica_id: a for a in plan.assignments}
    for node in f.nodes:
        if not node.alive:
            continue
        for shard in node.shards:
            model_ = s2.models[shard.model]
            if shard.replica_id in current:
                assert shard.fingerprint == fingerprint(model_, "b11434")
                assert shard.state is ShardState.READY
    assert {a.kind for a in plan.actions} <= {ActionKind.KEEP}
