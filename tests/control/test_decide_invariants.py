"""`decide(state, now)` over seeded random control states (fleets, leadership, connections, acknowledgements, actions
in flight and failed): it never starts a shard twice, never commands a node that is not connected, never acts while
not leader, and never loses an action in flight. Some models are autoscaled (a replicas range around their count):
the plan places exactly the count the autoscaler wants, within the range."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from types import MappingProxyType
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.control.capabilities import action_features
from llmgw.control.deciding import SETTLE_AFTER, action_answered, action_failed, action_key, decide
from llmgw.control.state import ControlState, InFlight, Leadership, WatchState, frozen
from llmgw.control.registry import FleetRegistry
from llmgw.plan import agent_settings_fingerprint
from llmgw.plan.autoscaling import Scale
from llmgw.plan.types import ActionKind
from llmgw.settings.model import Scaling, Settings
from llmgw.wire.features import ALL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))
from test_invariants import random_case  # noqa: E402


def autoscaled(settings: Settings, rng: random.Random) -> Settings:
    """`settings` with about half its models given a replicas range around their count."""
    models = dict(settings.models)
    for name, model in sorted(models.items()):
        if model.endpoints or rng.random() < 0.5:
            continue
        low = rng.choice([0, 0, 1, max(model.replicas - 1, 0)])
        scaling = Scaling(min=low, max=low + rng.randint(1, 3), queue_per_replica=rng.choice([1.0, 4.0]),
                          scale_up_window=rng.choice([0.0, 30.0]), scale_down_window=rng.choice([0.0, 300.0]),
                          cooldown=rng.choice([0.0, 60.0]), idle=rng.choice([5.0, 600.0]))
        models[name] = replace(model, replicas=low, scaling=scaling)
    return replace(settings, models=MappingProxyType(models))


def random_state(seed: int, vary_answers: bool = False) -> tuple[ControlState, float]:
    """A random control state at `now` (returned) after a first pass 10 s before, with some of its actions answered
    2 s after the send and some failed. `vary_answers`: the first pass 10, 30 or 60 s before and answers 0.5-45 s
    after it, so that some answered actions settled out (the plan-reuse tests build on the plain states)."""
    rng = random.Random(seed)
    settings, fleet = random_case(seed)
    if vary_answers:
        settings = autoscaled(settings, rng)
    now = 1000.0
    registry = FleetRegistry(lost_after=30.0)
    for node in fleet.nodes:
        seen = now - (100.0 if not node.alive else rng.choice([0.0, 5.0, 20.0]))
        registry, _ = registry.register(node, seen, agent_version="0.1.0",
                                        features=ALL if rng.random() < 0.8 else ("adopt", "install:llama.cpp"))
        if rng.random() < 0.2:
            registry, _ = registry.disconnect(node.node_id, seen)
    registry, _ = registry.expire(now)
    acked = {n.node_id: agent_settings_fingerprint(settings, n.node_id) for n in fleet.nodes if rng.random() < 0.7}
    state = ControlState(watch=WatchState(settings=settings), fleet=registry,
                         leadership=Leadership(rng.random() < 0.8, "someone"), acked_settings=frozen(acked))
    # a first pass puts actions in flight, some time ago; some are answered after a while, some fail: the answer
    # times vary, so the settle window's start (the answer, not the send) matters
    sent = now - (rng.choice([10.0, 30.0, 60.0]) if vary_answers else 10.0)
    _, state = decide(replace(state, leadership=Leadership(True, "me")), sent)
    for key in list(state.in_flight):
        roll = rng.random()
        answered = min(now, sent + (rng.choice([0.5, 2.0, 20.0, 45.0]) if vary_answers else 2.0))
        if roll < 0.3:
            state = action_answered(state, key, answered)
        elif roll < 0.5:
            state = action_failed(state, key, "refused", answered, delay=rng.choice([None, 3.0, 30.0]))
    if vary_answers:  # the autoscaler's counts anywhere in their ranges, decided a while ago
        state = replace(state, scales=frozen({
            name: Scale(rng.randint(m.scaling.min, m.scaling.max), "seeded", changed_at=sent, busy_at=sent)
            for name, m in settings.models.items() if m.scaling is not None}))
    return replace(state, leadership=Leadership(rng.random() < 0.8, "someone")), now


@pytest.mark.parametrize("seed", range(60))
def test_decide_keeps_its_promises_on_random_states(seed):
    state, now = random_state(seed, vary_answers=True)
    decision, after = decide(state, now)
    sent = decision.send
    keys = [action_key(a) for a in sent]
    assert len(keys) == len(set(keys)), "an action is sent once per pass"
    starts = [(a.node_id, a.shard_id or a.replica_id) for a in sent if a.kind in (ActionKind.START, ActionKind.RESTART)]
    assert len(starts) == len(set(starts)), "a shard is started once"
    settling = {key for key, flight in state.in_flight.items()
                if flight.answered_at is None or now - flight.answered_at <= SETTLE_AFTER}
    assert not set(keys) & settling, "nothing in flight is sent again until SETTLE_AFTER seconds after its answer"
    for action in sent:
        record = state.fleet.get(action.node_id)
        assert record is not None and record.connected and not record.lost, "only connected nodes are commanded"
        failure = state.failures.get(action_key(action))
        assert failure is None or failure.retry_at <= now, "a failed action waits for its retry time"
        assert set(action_features(action, state.settings)) <= record.features, "only what the agent lists is sent"
    if not state.leadership.leader:
        assert sent == (), "nothing is sent while not leader"
        assert {r.outcome for r in decision.record.actions} <= {"skipped"}
    for key, flight in state.in_flight.items():
        kept = after.in_flight.get(key)
        if flight.answered_at is None:
            assert kept == flight, "an action waiting for its answer stays in flight"
        elif now - flight.answered_at <= SETTLE_AFTER:
            assert key not in keys, "an answered action settles for SETTLE_AFTER seconds after its answer"
    for key in keys:
        assert isinstance(after.in_flight[key], InFlight), "what is sent is in flight afterwards"
    for name, model in state.settings.models.items():
        if model.scaling is not None:
            wanted = after.scales[name].wanted
            assert model.scaling.min <= wanted <= model.scaling.max, "the count stays in the range"
            placed = {a.replica_id for a in decision.plan.assignments if a.model == name}
            unplaced = {u.replica_id for u in decision.plan.unplaced if u.model == name}
            assert placed | unplaced == {f"{name}-{n}" for n in range(wanted)}, "the plan places the wanted count"
    # a second pass at the same moment sends nothing new
    again, _ = decide(after, now)
    assert not {action_key(a) for a in again.send} & set(keys)


def test_a_start_answered_late_is_not_sent_again_within_the_settle_window_after_its_answer():
    """Sent at t=0, answered at t=20 (a slow node), not shown running yet at t=30: 10 s after the answer it still
    settles (SETTLE_AFTER is 15 s from the answer, not from the send); at t=40 it is let go and planned again."""
    state, _ = random_state(0)
    state = replace(state, leadership=Leadership(True, "me"), in_flight=frozen())
    decision, after = decide(state, 0.0)
    starts = [a for a in decision.send if a.kind is ActionKind.START]
    assert starts, "seed 0 places a replica"
    key = action_key(starts[0])
    after = action_answered(after, key, 20.0)
    assert key not in {action_key(a) for a in decide(after, 30.0)[0].send}
    assert key in decide(after, 30.0)[1].in_flight
    settled = decide(after, 40.0)[1]  # the pass that finds it settled lets it go; the next one plans it again
    assert key not in settled.in_flight
    assert key in {action_key(a) for a in decide(settled, 40.0)[0].send}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 59), ago=st.floats(0.0, 120.0),
       answers=st.lists(st.one_of(st.none(), st.floats(0.0, 120.0)), min_size=1, max_size=8))
def test_decide_never_resends_an_action_waiting_for_its_answer_or_settling(seed, ago, answers):
    """Whatever the answer times (`answers`: per action in flight, seconds after the send, None: no answer yet), a
    pass sends nothing that waits for its answer or was answered at most SETTLE_AFTER seconds ago."""
    state, now = random_state(seed)
    state = replace(state, leadership=Leadership(True, "me"), in_flight=frozen(), failures=frozen())
    sent = now - ago
    _, state = decide(state, sent)
    for index, key in enumerate(state.in_flight):
        delay = answers[index % len(answers)]
        if delay is not None and sent + delay <= now:
            state = action_answered(state, key, sent + delay)
    decision, _ = decide(state, now)
    settling = {key for key, flight in state.in_flight.items()
                if flight.answered_at is None or now - flight.answered_at <= SETTLE_AFTER}
    assert not {action_key(a) for a in decision.send} & settling
