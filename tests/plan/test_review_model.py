"""The review's pure parts: fleet snapshots, headroom, steps per node, project changes, and the "fits" verdict
agreeing with the planner on seeded random fleets."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from plan_fleets import GiB, cpu_node, fleet, gpu_node, model, settings, shard
from test_invariants import random_case

from llmgw.errors import UsageError
from llmgw.plan import Fleet, MemoryBandwidth, ShardState, make_plan
from llmgw.plan.headroom import CpuHeadroom, GpuHeadroom, headroom
from llmgw.plan.project_changes import ValueChange, project_changes
from llmgw.plan.reviewing import Step, build_review, node_steps, review_to_json, staleness
from llmgw.plan.snapshot import FleetSnapshot, fleet_revision, snapshot_from_json, snapshot_to_json
from llmgw.settings.model import Organisation, Project, Quota, Team, frozen_map

GEMMA = model("gemma", cores=2, memory=2 * GiB)
LLAMA = model("llama", gpus=2, gpu_class="h100-80g", tp=2)


@pytest.mark.parametrize("seed", range(20))
def test_a_snapshot_reads_back_as_the_same_fleet(seed):
    _settings, f = random_case(seed)
    s = settings(GEMMA)
    probed = replace(cpu_node("zy"), memory_bandwidth=MemoryBandwidth(11.5e9, 31.7e9, 2, 0.51))
    f = Fleet(f.nodes + (cpu_node("zz", shards=[shard(GEMMA, 0, state=ShardState.FAILED)]), probed))
    data = json.loads(json.dumps(snapshot_to_json(FleetSnapshot(f, "2026-12-01T00:00:00Z", s.commit))))
    back = snapshot_from_json(data)
    assert back.fleet == Fleet(tuple(sorted(f.nodes, key=lambda n: n.node_id)))
    assert back.revision == data["revision"] == fleet_revision(f)
    assert back.taken_at == "2026-12-01T00:00:00Z" and back.settings_commit == s.commit


@pytest.mark.parametrize(("data", "message"), [
    ({"nodes": []}, "version: missing"),
    ({"version": 2, "nodes": []}, "version: version 2 is not known"),
    ({"version": 1, "nodes": [{"node_id": 3}]}, "nodes[0].node_id: expected str, got 3"),
    ({"version": 1, "nodes": [{"node_id": "a", "cpu_cores": True}]}, "nodes[0].cpu_cores: expected float"),
    ({"version": 1, "nodes": [{"node_id": "a", "shards": [{"shard_id": "x", "replica_id": "x", "model": "m",
                                                           "state": "dancing"}]}]},
     "nodes[0].shards[0].state: unknown state 'dancing'"),
    ({"version": 1, "nodes": [{"node_id": "a"}, {"node_id": "a"}]}, "nodes: node a appears twice"),
    ({"version": 1, "nodes": [{"node_id": "a", "memory_bandwidth": {"one_core_bytes_per_second": 1e9}}]},
     "nodes[0].memory_bandwidth.all_cores_bytes_per_second: missing"),
    ([1, 2], "the top level: expected an object"),
])
def test_a_bad_snapshot_is_refused_naming_the_key(data, message):
    with pytest.raises(UsageError) as caught:
        snapshot_from_json(data, "fleet.json")
    assert str(caught.value).startswith("fleet.json is not a fleet snapshot: ")
    assert message in str(caught.value)


def test_headroom_counts_observed_shards_before_and_assignments_after():
    s = settings(GEMMA, replace(LLAMA, replicas=2))
    f = fleet(gpu_node("g1", count=4, foreign=(3,), shards=[shard(LLAMA, 0, devices=("0", "1"))]),
              gpu_node("g2", count=2, alive=False), cpu_node("c1", cores=8, memory=32 * GiB,
                                                            shards=[shard(model("old", cores=1), 0)]))
    room = headroom(f, make_plan(s, f))
    assert room.gpus == (GpuHeadroom("h100-80g", 3, 1, 1, 1, 1),)  # GPU 3 foreign, g2 not alive, llama-1 unplaced
    # g1 64 cores + c1 8; before: old holds 1 core; after: old stops, gemma takes 2 cores and 2Gi.
    assert room.cpu == CpuHeadroom(72, 71, 70, 544 * GiB, 544 * GiB, 542 * GiB)


def test_steps_per_node_show_a_move_on_both_nodes():
    s = settings(GEMMA)
    f = fleet(cpu_node("node01", alive=False, shards=[shard(GEMMA, 0)]),
              cpu_node("node02", shards=[shard(model("old", cores=1), 0)]))
    steps = {n.node_id: n.steps for n in node_steps(make_plan(s, f))}
    assert [(x.verb, x.other_node) for x in steps["node01"]] == [("move out", "node02")]
    assert steps["node02"][0].verb == "move in" and steps["node02"][0].other_node == "node01"
    assert steps["node02"][1] == Step("stop", "old-0/0", "old-0", "old", reason="model old is not in the catalog")


def test_a_team_quota_change_shows_under_each_of_its_projects():
    def with_projects(limit):
        base = settings(GEMMA)
        return replace(
            base, organisations=frozen_map({"acme": Organisation("acme")}),
            teams=frozen_map({"platform": Team("platform", "acme", Quota(concurrent_requests=limit))}),
            projects=frozen_map({name: Project(name, "platform", "acme", models=("gemma",))
                                 for name in ("a", "b")}))

    changes = project_changes(with_projects(64), with_projects(32))
    assert [c.project for c in changes] == ["a", "b"]
    assert changes[0].quotas == (ValueChange("team platform", "concurrent_requests", "64", "32"),)
    added = project_changes(settings(GEMMA), with_projects(64))
    assert [(c.project, c.action, c.models_added) for c in added] == [("a", "added", ("gemma",)),
                                                                      ("b", "added", ("gemma",))]


def random_change(seed: int):
    """A random settings change on a random fleet: the catalog's replicas and resources moved about."""
    head, f = random_case(seed)
    rng = random.Random(seed * 7 + 1)
    base = replace(head, models=frozen_map({
        name: replace(m, replicas=rng.randint(0, 3)) if rng.random() < 0.5 else m
        for name, m in head.models.items()}), commit="b" * 40)
    return base, replace(head, commit="h" * 40), f


@pytest.mark.parametrize("seed", range(60))
def test_the_verdict_agrees_with_the_planners_unplaced_list(seed):
    base, head, f = random_change(seed)
    review = build_review(base, head, FleetSnapshot(f), base_ref="main", head_ref="pr", fleet_source="test")
    plan = make_plan(head, f, allow_empty=True)
    assert review.fits == (not plan.unplaced)
    assert review.exit_code == (3 if plan.unplaced else 2 if (plan.changes or base != head) else 0)
    assert [u.replica_id for u in review.unplaced] == [u.replica_id for u in plan.unplaced]
    alive = {n.node_id for n in f.nodes}
    for item in review.unplaced:
        named = {node for node, _why in item.reasons} - {"all nodes"}  # a sentence for the whole fleet may lead
        assert named == alive or len(alive) > 12, "every node says why not"
    document = review_to_json(review)
    assert json.loads(json.dumps(document)) == document
    assert staleness(document, review) == []
