"""What the agent tells a control plane about the KV-cache blocks its vLLM shards hold: net changes (pure).

The agent mirrors each vLLM shard's blocks from the engine's KV-cache events (`llmgw.agent.kv_watch`). For each
connection it remembers what it last sent per shard; `kv_messages(current, sent)` returns the `KvBlocks` messages
that bring the control plane from `sent` to `current` and what has then been sent:

- a shard the control plane has not heard of on this connection: a full copy (`full`, everything held);
- a shard whose mirror was reset since (sequence gap, engine restart, `AllBlocksCleared`: `resets` grew) or whose
  block size or hashing changed: a full copy;
- otherwise the blocks stored and removed since, nothing when nothing changed;
- a shard gone from `current` (its engine stopped): one full message holding nothing.

A full copy of more than `max_hashes` blocks is split: the first message is `full`, the rest add to it (a gRPC
message stays far below its 4 MiB limit: 65,536 hashes are 512 KiB). The wire format: `KvBlocks` in
llmgw/wire/agent.proto.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.wire import pb

MAX_HASHES = 65536


@dataclass(frozen=True)
class ShardBlocks:
    """One vLLM shard's mirror as sent up: `held` the block hashes its engine holds (every full-attention group),
    `block_size` tokens per block (0: none seen yet), `resets` how often its mirror was emptied, and how the engine
    hashes (`hash_algorithm`, `hash_seed`)."""

    shard_id: str
    replica_id: str
    held: frozenset[int] = frozenset()
    block_size: int = 0
    resets: int = 0
    hash_algorithm: str = ""
    hash_seed: str = ""


def _message(blocks: ShardBlocks, full: bool, stored=(), removed=()) -> pb.KvBlocks:
    return pb.KvBlocks(shard_id=blocks.shard_id, replica_id=blocks.replica_id, full=full, stored=sorted(stored),
                       removed=sorted(removed), block_size=blocks.block_size, hash_algorithm=blocks.hash_algorithm,
                       hash_seed=blocks.hash_seed)


def _chunks(hashes: frozenset[int], size: int) -> list[list[int]]:
    ordered = sorted(hashes)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)] or [[]]


def _needs_full(now: ShardBlocks, before: ShardBlocks | None) -> bool:
    return (before is None or now.resets != before.resets or now.block_size != before.block_size
            or (now.hash_algorithm, now.hash_seed) != (before.hash_algorithm, before.hash_seed))


def kv_messages(current: Mapping[str, ShardBlocks], sent: Mapping[str, ShardBlocks], *,
                max_hashes: int = MAX_HASHES) -> tuple[list[pb.KvBlocks], dict[str, ShardBlocks]]:
    """The messages that bring a control plane that was sent `sent` to `current` (both by shard id), in shard id
    order, and the new `sent` (equal to `current`). Pure; never raises. Raises ValueError when `max_hashes` < 1."""
    if max_hashes < 1:
        raise ValueError(f"max_hashes must be at least 1, not {max_hashes}")
    messages: list[pb.KvBlocks] = []
    for shard_id in sorted(set(current) | set(sent)):
        now, before = current.get(shard_id), sent.get(shard_id)
        if now is None:
            assert before is not None
            messages.append(_message(ShardBlocks(shard_id, before.replica_id), True))
        elif _needs_full(now, before):
            first, *rest = _chunks(now.held, max_hashes)
            messages.append(_message(now, True, first))
            messages.extend(_message(now, False, chunk) for chunk in rest)
        else:
            assert before is not None
            stored, removed = now.held - before.held, before.held - now.held
            if stored or removed:
                messages.append(_message(now, False, stored, removed))
    return messages, dict(current)
