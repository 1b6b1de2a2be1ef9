"""The KV-block mirror (`KvBlocks.apply`) as a property: for any sequence of stores, removals and clears an engine
can send, a hash is held in a group exactly while at least one block of it is left there (vLLM does not de-duplicate
cached blocks, so one hash may be stored by several blocks and removed once per block)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.tools.vllm_kv_events import (
    FULL_ATTENTION, AllBlocksCleared, BlockRemoved, BlockStored, KvBlocks, KvEventBatch,
)

HASHES = st.integers(min_value=0, max_value=3)  # few hashes, so that copies and re-stores are common


def _stored(group: int | None, hashes: list[int]) -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_block_hash=None, token_ids=(0,) * (16 * len(hashes)),
                       block_size=16, group_idx=group, spec_kind=FULL_ATTENTION if group is not None else "")


@st.composite
def engine_batches(draw, groups: tuple[int | None, ...]) -> tuple[list[KvEventBatch], list[Counter]]:
    """Batches an engine may send (a removal names only blocks it holds), and after each the blocks it holds:
    how many blocks of each (group, hash)."""
    blocks: Counter = Counter()
    batches, expected = [], []
    for seq in range(draw(st.integers(min_value=1, max_value=12))):
        events = []
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            group = draw(st.sampled_from(groups))
            held = sorted(h for (g, h), n in blocks.items() if g == group and n > 0)
            kind = draw(st.sampled_from(["store", "store", "remove", "remove", "clear"]) if held
                        else st.sampled_from(["store", "store", "clear"]))
            if kind == "store":  # a request's blocks: distinct hashes (each chains its parent's)
                hashes = draw(st.lists(HASHES, min_size=1, max_size=4, unique=True))
                events.append(_stored(group, hashes))
                blocks.update((group, h) for h in hashes)
            elif kind == "remove":
                hashes = draw(st.lists(st.sampled_from(held), min_size=1, max_size=len(held), unique=True))
                events.append(BlockRemoved(block_hashes=tuple(hashes), group_idx=group))
                blocks.subtract((group, h) for h in hashes)
            else:
                events.append(AllBlocksCleared())
                blocks.clear()
        batches.append(KvEventBatch(topic="kv", seq=seq, timestamp=1.0, events=tuple(events)))
        expected.append(+blocks)
    return batches, expected


def _check(batches: list[KvEventBatch], expected: list[Counter], groups: tuple[int | None, ...]) -> None:
    state = KvBlocks()
    for batch, blocks in zip(batches, expected, strict=True):
        state = state.apply(batch)
        for group in groups:
            assert state.groups.get(group, frozenset()) == {h for (g, h) in blocks if g == group}, (batch.seq, group)
        assert state.resets == sum(isinstance(e, AllBlocksCleared) for b in batches[:batch.seq + 1] for e in b.events)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_hash_is_held_in_a_group_exactly_while_a_block_of_it_is_left_there(data):
    groups = (0, 1)
    batches, expected = data.draw(engine_batches(groups))
    _check(batches, expected, groups)
    state = KvBlocks()
    for batch in batches:
        state = state.apply(batch)
    final = [{h for (g, h) in expected[-1] if g == group} for group in state.groups]  # groups stored in since a clear
    want = set.intersection(*final) if final else set()  # every group here is full attention: intersected
    assert state.held() == want


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_events_without_a_group_mirror_one_group_the_same_way(data):
    """Older vLLM sends no group_idx: every event is of the one group None."""
    batches, expected = data.draw(engine_batches((None,)))
    _check(batches, expected, (None,))
