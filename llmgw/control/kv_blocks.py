"""The control plane's mirror of the prefix-cache blocks every vLLM replica holds, built from the agents' `KvBlocks`
messages (pure): data in, a new immutable `llmgw.routes.BlockSnapshot` out, handed to the gateway.

Rules (the agent's side is `llmgw.agent.kv_forwarding`):
- a `full` update replaces what was known of the replica; one that holds nothing and names no block size (an engine
  stopped, or one that has sent no event yet) removes the replica: the gateway then treats it as sending no events;
- any other update adds `stored` and takes away `removed`; one for a replica not known yet starts from nothing
  (its full copy was lost: the next reset brings it back);
- a node that disconnects loses its replicas' entries: its agent sends full copies when it comes back;
- a replica holds at most `cap` hashes (llmgw.yaml `limits.kv_blocks_per_replica`, default
  `KV_BLOCKS_PER_REPLICA`): an update that would make it hold more removes the replica instead (the gateway routes
  to it as to one sending no events) until a full update within the cap. No update touches another replica, and
  which replicas a node may send at all is checked before (`llmgw.control.report_scope.blocks_problem`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

from llmgw.routes import BlockSnapshot, ReplicaBlocks

KV_BLOCKS_PER_REPLICA = 1_000_000
"""The default cap on the block hashes one replica's entry holds (llmgw.yaml `limits.kv_blocks_per_replica`)."""


@dataclass(frozen=True)
class BlocksUpdate:
    """One agent message about one replica's blocks (`KvBlocks` in llmgw/wire/agent.proto, fields alike)."""

    replica_id: str
    full: bool
    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    block_size: int = 0
    hash_algorithm: str = ""
    hash_seed: str = ""


def apply_block_updates(snapshot: BlockSnapshot, node_id: str, updates: Iterable[BlocksUpdate], *,
                        cap: int = KV_BLOCKS_PER_REPLICA) -> BlockSnapshot:
    """`snapshot` after `updates` from `node_id`'s agent, in order; `snapshot` itself when nothing changed.

    A replica that would hold more than `cap` hashes is removed instead (module docstring).
    Cost: each update copies the replica's set (O(blocks held)). Pure; never raises."""
    replicas = dict(snapshot.replicas)
    for update in updates:
        if not update.replica_id:
            continue
        before = replicas.get(update.replica_id)
        if update.full:
            if (not update.stored and not update.block_size) or len(update.stored) > cap:
                replicas.pop(update.replica_id, None)
                continue
            blocks = frozenset(update.stored)
        else:
            held = before.blocks if before is not None else frozenset()
            blocks = (held | frozenset(update.stored)) - frozenset(update.removed)
        if len(blocks) > cap:
            replicas.pop(update.replica_id, None)
            continue
        replicas[update.replica_id] = ReplicaBlocks(blocks=blocks, block_size=update.block_size,
                                                    hash_algorithm=update.hash_algorithm,
                                                    hash_seed=update.hash_seed, node_id=node_id)
    if replicas == dict(snapshot.replicas):
        return snapshot
    return BlockSnapshot(replicas=MappingProxyType(replicas), version=snapshot.version + 1)


def forget_node(snapshot: BlockSnapshot, node_id: str) -> BlockSnapshot:
    """`snapshot` without the replicas `node_id` reported (its agent disconnected). Pure."""
    kept = {r: b for r, b in snapshot.replicas.items() if b.node_id != node_id}
    if len(kept) == len(snapshot.replicas):
        return snapshot
    return BlockSnapshot(replicas=MappingProxyType(kept), version=snapshot.version + 1)
