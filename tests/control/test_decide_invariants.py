"""`decide(state, now)` over seeded random control states (fleets, leadership, connections, acknowledgements, actions
in flight and failed): it never starts a shard twice, never commands a node that is not connected, never acts while
not leader, and never loses an action in flight."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.control.deciding import action_answered, action_failed, action_key, decide
from llmgw.control.state import ControlState, InFlight, Leadership, WatchState, frozen
from llmgw.control.registry import FleetRegistry
from llmgw.plan import agent_settings_fingerprint
from llmgw.plan.types import ActionKind

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))
from test_invariants import random_case  # noqa: E402


def random_state(seed: int) -> tuple[ControlState, float]:
    rng = random.Random(seed)
    settings, fleet = random_case(seed)
    now = 1000.0
    registry = FleetRegistry(lost_after=30.0)
    for node in fleet.nodes:
        seen = now - (100.0 if not node.alive else rng.choice([0.0, 5.0, 20.0]))
        registry, _ = registry.register(node, seen, agent_version="0.1.0",
                                        features=("install:llama.cpp",) if rng.random() < 0.8 else ("adopt",))
        if rng.random() < 0.2:
            registry, _ = registry.disconnect(node.node_id, seen)
    registry, _ = registry.expire(now)
    acked = {n.node_id: agent_settings_fingerprint(settings, n.node_id) for n in fleet.nodes if rng.random() < 0.7}
    state = ControlState(watch=WatchState(settings=settings), fleet=registry,
                         leadership=Leadership(rng.random() < 0.8, "someone"), acked_settings=frozen(acked))
    # a first pass puts actions in flight; some are answered, some fail
    _, state = decide(replace(state, leadership=Leadership(True, "me")), now - 10.0)
    for key in list(state.in_flight):
        roll = rng.random()
        if roll < 0.3:
            state = action_answered(state, key, now - 8.0)
        elif roll < 0.5:
            state = action_failed(state, key, "refused", now - 8.0, delay=rng.choice([None, 3.0, 30.0]))
    return replace(state, leadership=Leadership(rng.random() < 0.8, "someone")), now


@pytest.mark.parametrize("seed", range(60))
def test_decide_keeps_its_promises_on_random_states(seed):
    state, now = random_state(seed)
    decision, after = decide(state, now)
    sent = decision.send
    keys = [action_key(a) for a in sent]
    assert len(keys) == len(set(keys)), "an action is sent once per pass"
    starts = [(a.node_id, a.shard_id or a.replica_id) for a in sent if a.kind in (ActionKind.START, ActionKind.RESTART)]
    assert len(starts) == len(set(starts)), "a shard is started once"
    assert not set(keys) & set(state.in_flight), "nothing already in flight is sent again"
    for action in sent:
        record = state.fleet.get(action.node_id)
        assert record is not None and record.connected and not record.lost, "only connected nodes are commanded"
        failure = state.failures.get(action_key(action))
        assert failure is None or failure.retry_at <= now, "a failed action waits for its retry time"
    if not state.leadership.leader:
        assert sent == (), "nothing is sent while not leader"
        assert {r.outcome for r in decision.record.actions} <= {"skipped"}
    for key, flight in state.in_flight.items():
        kept = after.in_flight.get(key)
        if flight.answered_at is None:
            assert kept == flight, "an action waiting for its answer stays in flight"
    for key in keys:
        assert isinstance(after.in_flight[key], InFlight), "what is sent is in flight afterwards"
    # a second pass at the same moment sends nothing new
    again, _ = decide(after, now)
    assert not {action_key(a) for a in again.send} & set(keys)
