"""The autoscaler inside `decide` (pure, no clock of its own): a control plane that restarts while a node it knew has
not reconnected yet never stops that node's replicas of a model with `min: 0`, and keeps the count they show once
it is back."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from llmgw.control.deciding import decide
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState, Leadership, WatchState
from llmgw.identity import ShardState
from llmgw.plan import fingerprint
from llmgw.plan.identity import engine_version_of
from llmgw.plan.types import ActionKind, NodeState, ObservedShard
from llmgw.settings import load_directory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import settings_seed  # noqa: E402

from .conftest import MODEL_YAML  # noqa: E402

RANGE = "{min: 0, max: 3, idle: 10m}"


def test_a_restarted_control_plane_waits_for_its_known_nodes_before_it_decides_a_count(tmp_path):
    seed = settings_seed.write_seed(tmp_path / "seed", "tiny", MODEL_YAML.format(sha="a" * 64, replicas=RANGE))
    settings = load_directory(seed)
    model = settings.models["tiny"]
    shards = tuple(ObservedShard(f"tiny-{n}/0", f"tiny-{n}", "tiny", ShardState.READY,
                                 fingerprint(model, engine_version_of(settings, model)), port=9000 + n)
                   for n in range(2))
    node = NodeState("n1", cpu_cores=8, memory_bytes=16 << 30, engines_installed=frozenset({"llama.cpp@b11434"}),
                     shards=shards)
    state = ControlState(watch=WatchState(settings=settings), fleet=FleetRegistry(lost_after=30.0),
                         leadership=Leadership(True, "me")).recovering_from(frozenset({"n1"}), 0.0, 60.0)

    decision, state = decide(state, 1.0)  # n1 not back yet: nothing runs, nothing is decided for good
    assert decision is not None and decision.send == ()
    fleet, _ = state.fleet.register(node, 2.0, agent_version="0.1.0")
    decision, state = decide(replace(state, fleet=fleet), 2.0)
    assert decision is not None
    assert not [a for a in decision.send if a.kind is ActionKind.STOP], decision.send
    assert state.scales["tiny"].wanted == 2 and "2 replicas running" in state.scales["tiny"].reason
    decision, state = decide(state, 3.0)  # recovered: the count holds
    assert state.scales["tiny"].wanted == 2 and not decision.send
