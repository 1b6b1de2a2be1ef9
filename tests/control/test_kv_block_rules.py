"""The control plane's mirror of each replica's prefix-cache blocks, rule by rule (llmgw.control.kv_blocks).

A table of updates and the snapshot each gives; the agent's side and the gRPC path are in
tests/agent/test_kv_forwarding.py.
"""

from __future__ import annotations

import pytest

from llmgw.control.kv_blocks import BlocksUpdate, apply_block_updates, forget_node
from llmgw.routes import BlockSnapshot, ReplicaBlocks

HELD = ReplicaBlocks(frozenset({1, 2, 3}), 16, "sha256_cbor", "0", "n1")
START = BlockSnapshot({"r1": HELD, "r9": ReplicaBlocks(frozenset({9}), 16, "sha256", "", "n2")}, version=4)


@pytest.mark.parametrize("updates, expected", [
    # a delta adds `stored` and takes away `removed`, and takes the update's hashing and the reporting node
    ([BlocksUpdate("r1", False, (4,), (1,), 32, "sha256", "7")],
     {"r1": ReplicaBlocks(frozenset({2, 3, 4}), 32, "sha256", "7", "n3")}),
    # a block both stored and removed in one update is gone
    ([BlocksUpdate("r1", False, (5,), (5, 2), 16, "sha256_cbor", "0")],
     {"r1": ReplicaBlocks(frozenset({1, 3}), 16, "sha256_cbor", "0", "n3")}),
    # a delta for a replica not known starts from nothing
    ([BlocksUpdate("r2", False, (7, 8), (), 16)], {"r2": ReplicaBlocks(frozenset({7, 8}), 16, "", "", "n3")}),
    # a full update replaces what was known
    ([BlocksUpdate("r1", True, (5,), (), 16, "sha256_cbor", "0")],
     {"r1": ReplicaBlocks(frozenset({5}), 16, "sha256_cbor", "0", "n3")}),
    # a full update holding nothing but naming a block size keeps the replica, empty
    ([BlocksUpdate("r1", True, (), (), 16)], {"r1": ReplicaBlocks(frozenset(), 16, "", "", "n3")}),
    # an update without a replica id is skipped, and the next still applies
    ([BlocksUpdate("", True, (4,), (), 16), BlocksUpdate("r1", True, (5,), (), 16)],
     {"r1": ReplicaBlocks(frozenset({5}), 16, "", "", "n3")}),
    # updates apply in order
    ([BlocksUpdate("r1", True, (5,), (), 16), BlocksUpdate("r1", False, (6,), (5,), 16)],
     {"r1": ReplicaBlocks(frozenset({6}), 16, "", "", "n3")}),
])
def test_each_update_changes_its_replica_only_and_the_version_grows_by_one(updates, expected):
    after = apply_block_updates(START, "n3", updates)
    assert dict(after.replicas) == {**START.replicas, **expected}
    assert after.version == START.version + 1
    assert dict(START.replicas) == {"r1": HELD, "r9": START.replicas["r9"]}  # the old snapshot is untouched


def test_a_full_update_holding_nothing_without_a_block_size_removes_the_replica():
    after = apply_block_updates(START, "n1", [BlocksUpdate("r1", True, (), (), 0, "sha256_cbor")])
    assert dict(after.replicas) == {"r9": START.replicas["r9"]} and after.version == 5
    assert apply_block_updates(START, "n1", [BlocksUpdate("r7", True)]) is START  # an unknown one: nothing changes


@pytest.mark.parametrize("updates", [
    [],
    [BlocksUpdate("", False, (4,), (), 16)],  # no replica id: ignored
    [BlocksUpdate("r1", False, (1, 2), (7,), 16, "sha256_cbor", "0")],  # what is already known
    [BlocksUpdate("r1", True, (1, 2, 3), (), 16, "sha256_cbor", "0")],
])
def test_updates_that_change_nothing_give_the_same_snapshot(updates):
    assert apply_block_updates(START, "n1", updates) is START


def test_a_disconnected_node_loses_its_replicas_and_only_those():
    after = forget_node(START, "n1")
    assert dict(after.replicas) == {"r9": START.replicas["r9"]} and after.version == 5
    assert forget_node(START, "n7") is START
    assert forget_node(after, "n2") == BlockSnapshot({}, version=6)
