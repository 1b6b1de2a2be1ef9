"""The status document built in proportion to the change (`StatusDocuments`) is exactly the one built from scratch,
and a readings-only heartbeat or a timer pass rebuilds none of its node entries nor its replicas section."""

from __future__ import annotations

import pytest

from llmgw.control.audit import audit_snapshot, state_changes, status_document
from llmgw.control.deciding import decide
from llmgw.control.documents import StatusDocuments
from llmgw.plan.types import ObservedShard, ShardState

from .test_plan_reuse import prepared, random_events, readings


def fresh(state) -> dict:
    return status_document(state.watch, state.fleet.records(), state.last_pass, state.last_plan)


def kept(documents: StatusDocuments, state) -> dict:
    return documents.build(state.watch, state.fleet, state.last_pass, state.last_plan)


@pytest.mark.parametrize("seed", range(40))
def test_the_kept_document_is_the_document_built_from_scratch(seed):
    state, now, rng = prepared(seed)
    documents = StatusDocuments()
    assert kept(documents, state) == fresh(state)
    for _ in range(4):
        now += rng.choice([0.5, 5.0, 40.0])
        state = random_events(state, rng, now)
        fleet, _ = state.fleet.expire(now)
        state = state.with_fleet(fleet)
        assert kept(documents, state) == fresh(state)
        _, state = decide(state, now)
        before = kept(documents, state)
        assert before == fresh(state)
        assert state_changes(audit_snapshot(before), audit_snapshot(kept(documents, state))) == []


def test_readings_only_heartbeats_and_a_timer_pass_rebuild_no_entry():
    state, now, rng = prepared(7)
    documents = StatusDocuments()
    first = kept(documents, state)
    built = documents.built
    registry = state.fleet
    for record in registry.records():  # every node beats: same shards, new readings
        if record.lost:
            continue
        registry, changed = registry.heartbeat(record.node_id, now + 5, shards=record.state.shards,
                                               readings=readings(record.state, rng, now + 5, cross=False))
        assert not changed
    _, state = decide(state.with_fleet(registry), now + 10)
    second = kept(documents, state)
    assert second == fresh(state)
    assert documents.built == built
    assert all(second["nodes"][n] is first["nodes"][n] for n in first["nodes"])
    assert second["replicas"] is first["replicas"]


def test_a_shard_changing_rebuilds_its_node_entry_only():
    state, now, rng = prepared(3)
    documents = StatusDocuments()
    first = kept(documents, state)
    record = next(r for r in state.fleet.records() if not r.lost)
    shard = ObservedShard("m-0/0", "m-0", "m", ShardState.FAILED, error="exit 9")
    registry, _ = state.fleet.shard_status(record.node_id, shard, now + 1)
    state = state.with_fleet(registry)
    second = kept(documents, state)
    assert second == fresh(state)
    assert second["nodes"][record.node_id] is not first["nodes"][record.node_id]
    assert all(second["nodes"][n] is first["nodes"][n] for n in first["nodes"] if n != record.node_id)
    assert second["replicas"] is not first["replicas"]


def test_the_plane_builds_a_status_with_readings_in_a_worker_thread(tmp_path):
    """The admin API builds a fleet's status (readings included) off the trio loop: given the state and the time,
    the plane's `status` needs nothing of trio's run (it raised "must be called from async context" before)."""
    import threading

    import trio

    from llmgw.control import ControlConfig, ControlPlane

    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "repo"), state_dir=tmp_path / "state"))
    state, now, rng = prepared(5)
    record = next(r for r in state.fleet.records() if not r.lost)
    registry, _ = state.fleet.heartbeat(record.node_id, now, readings=readings(record.state, rng, now, cross=False))
    state = state.with_fleet(registry)
    got: list[dict] = []

    async def main() -> None:
        def build() -> None:
            assert threading.current_thread() is not threading.main_thread()
            got.append(plane.status(state, now=now + 1.0))
        await trio.to_thread.run_sync(build)

    trio.run(main)
    node = got[0]["nodes"][record.node_id]
    assert node["readings"]["age_seconds"] == 1.0
    assert {k: v for k, v in node.items() if k != "readings"} == fresh(state)["nodes"][record.node_id]
