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
