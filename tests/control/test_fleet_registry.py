"""The fleet registry: registration, heartbeats, shard states, nodes lost and coming back."""

from __future__ import annotations

import pytest

from llmgw.control.registry import FleetRegistry
from llmgw.identity import EngineState
from llmgw.plan.types import MemoryBandwidth, NodeState, ObservedShard, ShardState


def shard(sid: str, state: ShardState = ShardState.READY, port: int = 9000) -> ObservedShard:
    replica = sid.split("/")[0]
    return ObservedShard(shard_id=sid, replica_id=replica, model=replica.rsplit("-", 1)[0], state=state, port=port)


def node(node_id: str, *shards: ObservedShard) -> NodeState:
    return NodeState(node_id=node_id, cpu_cores=8, memory_bytes=16 << 30, shards=tuple(shards))


def test_a_registered_node_is_alive_with_the_shards_it_reports():
    registry, changed = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0")), now=0.0)
    assert changed is True
    fleet = registry.fleet()
    assert [n.node_id for n in fleet.nodes] == ["n1"]
    assert fleet.nodes[0].alive and fleet.nodes[0].shards[0].shard_id == "gemma-0/0"


@pytest.mark.parametrize(
    "silent_for, disconnected, lost",
    [
        (10, False, False),   # heard from recently
        (10, True, False),    # stream broke a moment ago: still alive, replicas stay
        (31, False, True),    # silent longer than lost_after
        (31, True, True),
    ],
)
def test_a_node_is_lost_only_after_being_silent_longer_than_lost_after(silent_for, disconnected, lost):
    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0")), now=0.0)
    if disconnected:
        registry, _ = registry.disconnect("n1", now=0.0)
    registry, newly_lost = registry.expire(now=float(silent_for))
    assert newly_lost == (("n1",) if lost else ())
    view = registry.fleet().nodes[0]
    assert view.alive is (not lost)
    # a lost node offers no shards to the planner, so its replicas are placed elsewhere
    assert len(view.shards) == (0 if lost else 1)


def test_heartbeats_keep_a_node_alive_and_report_shard_changes():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0", ShardState.STARTING)), now=0.0)
    registry, same = registry.heartbeat("n1", now=20.0, shards=[shard("gemma-0/0", ShardState.STARTING)])
    assert same is False
    registry, changed = registry.heartbeat("n1", now=40.0, shards=[shard("gemma-0/0", ShardState.READY)])
    assert changed is True
    assert registry.expire(now=60.0)[1] == ()
    assert registry.fleet().nodes[0].shards[0].state is ShardState.READY


def test_a_returning_node_has_its_shards_adopted_as_reported():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0")), now=0.0)
    registry, _ = registry.expire(now=100.0)
    assert registry.fleet().nodes[0].alive is False
    registry, changed = registry.register(node("n1", shard("gemma-0/0", port=9123)), now=101.0)
    assert changed is True
    back = registry.fleet().nodes[0]
    assert back.alive and back.shards == (shard("gemma-0/0", port=9123),)


def test_messages_from_a_node_that_never_registered_are_ignored():
    registry = FleetRegistry(lost_after=30)
    assert registry.heartbeat("ghost", now=0.0, shards=[shard("x-0/0")]) == (registry, False)
    assert registry.shard_status("ghost", shard("x-0/0"), now=0.0) == (registry, False)
    assert registry.fleet().nodes == ()


def test_a_shard_status_replaces_that_shard_only():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("a-0/0"), shard("b-0/0")), now=0.0)
    registry, changed = registry.shard_status("n1", shard("a-0/0", ShardState.FAILED), now=1.0)
    assert changed is True
    states = {s.shard_id: s.state for s in registry.fleet().nodes[0].shards}
    assert states == {"a-0/0": ShardState.FAILED, "b-0/0": ShardState.READY}


@pytest.mark.parametrize(
    "events, installed, installing",
    [
        ([("installing", "")], set(), {"llama.cpp@b1"}),
        ([("installing", ""), ("installed", "")], {"llama.cpp@b1"}, set()),
        ([("installing", ""), ("failed", "sha256 mismatch")], set(), set()),
    ],
)
def test_engine_installs_move_between_installing_and_installed(events, installed, installing):
    registry, _ = FleetRegistry(lost_after=30).register(node("n1"), now=0.0)
    for state, error in events:
        registry, _ = registry.engine_status("n1", "llama.cpp@b1", EngineState(state), error, now=1.0)
    record = registry.get("n1")
    assert set(record.state.engines_installed) == installed
    assert set(record.state.engines_installing) == installing
    if events[-1][0] == "failed":
        assert record.engine_errors["llama.cpp@b1"] == "sha256 mismatch"


def test_next_expiry_is_when_the_quietest_live_node_would_be_lost():
    registry = FleetRegistry(lost_after=30)
    assert registry.next_expiry() is None
    registry, _ = registry.register(node("n1"), now=5.0)
    registry, _ = registry.register(node("n2"), now=2.0)
    assert registry.next_expiry() == 32.0


def test_a_transition_leaves_the_registry_it_started_from_unchanged():
    before, _ = FleetRegistry(lost_after=30).register(node("n1", shard("a-0/0")), now=0.0)
    after, _ = before.shard_status("n1", shard("a-0/0", ShardState.FAILED), now=1.0)
    assert before.fleet().nodes[0].shards[0].state is ShardState.READY
    assert after.fleet().nodes[0].shards[0].state is ShardState.FAILED


def test_readings_alone_leave_the_planners_view_unchanged_and_a_new_error_text_changes_it_without_waking():
    from llmgw.control.readings import NodeReadings

    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0", ShardState.FAILED)), now=0.0)
    before = registry.revision
    registry, changed = registry.heartbeat("n1", now=5.0, shards=[shard("gemma-0/0", ShardState.FAILED)],
                                           readings=NodeReadings(at=5.0, cpu_percent=12.0))
    assert (changed, registry.revision) == (False, before)
    failed = ObservedShard("gemma-0/0", "gemma-0", "gemma", ShardState.FAILED, port=9000, error="exit 1", restarts=1)
    registry, changed = registry.heartbeat("n1", now=10.0, shards=[failed])
    assert changed is False, "an error's wording does not wake the planner"
    assert registry.revision == before + 1, "but the plan's restart reason names it, so a plan is not reused"
    registry, changed = registry.disconnect("n1", now=11.0)
    assert registry.revision == before + 1


def test_expiry_is_checked_again_once_the_quietest_node_has_spoken():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1"), now=0.0)
    registry, _ = registry.register(node("n2"), now=10.0)
    assert registry.next_expiry() == 30.0
    registry, _ = registry.heartbeat("n1", now=25.0)
    assert registry.next_expiry() <= 30.0  # never later than the truth
    registry, lost = registry.expire(now=30.0)
    assert lost == () and registry.next_expiry() == 40.0  # n2, silent since 10 s
    registry, lost = registry.expire(now=40.0)
    assert lost == ("n2",) and registry.next_expiry() == 55.0


def test_slurm_job_steps_reported_in_heartbeats_reach_the_planner_and_a_change_starts_a_pass():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1"), now=0.0)
    registry, changed = registry.heartbeat("n1", 1.0, slurm_job_steps=3)
    assert changed and registry.fleet().nodes[0].slurm_job_steps == 3
    registry, changed = registry.heartbeat("n1", 2.0, slurm_job_steps=3)
    assert not changed
    registry, changed = registry.heartbeat("n1", 3.0, slurm_job_steps=0)  # the last step ended: plan again
    assert changed and registry.fleet().nodes[0].slurm_job_steps == 0


def test_a_nodes_probed_bandwidth_joins_its_state_without_waking_the_planner_and_outlives_a_new_register():
    probe = MemoryBandwidth(11.5e9, 31.7e9, 2, 0.51)
    registry, _ = FleetRegistry(lost_after=30).register(node("n1"), now=0.0)
    before = registry.revision
    registry, changed = registry.heartbeat("n1", now=1.0, memory_bandwidth=probe)
    assert changed is False and registry.fleet().node("n1").memory_bandwidth == probe
    assert registry.revision == before + 1, "the fleet a plan reads holds it: a plan is not reused"
    registry, _ = registry.heartbeat("n1", now=2.0)  # a beat without it (none sent yet by a new agent) keeps it
    registry, _ = registry.register(node("n1"), now=3.0)
    assert registry.fleet().node("n1").memory_bandwidth == probe


def test_a_forgotten_node_is_gone_from_the_fleet_and_a_node_never_known_changes_nothing():
    registry, _ = FleetRegistry(lost_after=30).register(node("n1", shard("gemma-0/0")), now=0.0, release_key="ABCD")
    registry, _ = registry.register(node("n2"), now=0.0)
    assert registry.get("n1").release_key == "ABCD" and registry.get("n2").release_key == ""
    forgotten, changed = registry.without("n1")
    assert changed is True and forgotten.revision == registry.revision + 1
    assert [r.node_id for r in forgotten.records()] == ["n2"] and forgotten.get("n1") is None
    assert [n.node_id for n in forgotten.fleet().nodes] == ["n2"]
    assert forgotten.without("ghost") == (forgotten, False)
