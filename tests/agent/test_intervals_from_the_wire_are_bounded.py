"""Intervals an AgentSettings message carries are held between 50 ms and a day (found by the ControlMessage
fuzzer: a heartbeat interval of 5e-324 s made the agent flood its stream until its outbox dropped answers)."""

from __future__ import annotations

import math

import pytest

from llmgw.agent import AgentConfig
from llmgw.agent.config import MAX_INTERVAL, MIN_INTERVAL
from llmgw.wire import pb


@pytest.mark.parametrize(("sent", "kept"), [(5e-324, MIN_INTERVAL), (0.01, MIN_INTERVAL), (2.0, 2.0),
                                            (math.inf, MAX_INTERVAL), (1e300, MAX_INTERVAL)])
def test_a_tiny_or_endless_interval_from_the_wire_is_bounded(tmp_path, sent, kept):
    config = AgentConfig(node_id="n", state_dir=tmp_path).with_settings(
        pb.AgentSettings(heartbeat_interval=sent, telemetry_interval=sent, shard_stop_grace=sent))
    assert (config.heartbeat_interval, config.telemetry_interval, config.shard_stop_grace) == (kept, kept, kept)


def test_a_nan_or_unset_interval_leaves_the_agents_own(tmp_path):
    base = AgentConfig(node_id="n", state_dir=tmp_path, heartbeat_interval=3.0)
    assert base.with_settings(pb.AgentSettings(heartbeat_interval=math.nan)).heartbeat_interval == 3.0
    assert base.with_settings(pb.AgentSettings()).heartbeat_interval == 3.0


def test_directories_given_on_the_command_line_stay_where_the_settings_would_move_them(tmp_path):
    """`llmgw agent --weights-dir/--engines-dir` (the systemd unit's /var/lib/llmgw/weights and engines, which the
    install journal and doctor's disk check name) win over agents/ weights_dir and engines_dir; without them the
    settings' directories, relative to the state directory, are taken."""
    sent = pb.AgentSettings(weights_dir="weights", engines_dir="engines")
    pinned = AgentConfig(node_id="n", state_dir=tmp_path / "agent", weights_dir=tmp_path / "w", engines_dir=tmp_path / "e",
                         fixed_dirs=frozenset({"weights_dir", "engines_dir"})).with_settings(sent)
    assert (pinned.weights_path, pinned.engines_path) == (tmp_path / "w", tmp_path / "e")
    moved = AgentConfig(node_id="n", state_dir=tmp_path / "agent").with_settings(sent)
    assert (moved.weights_path, moved.engines_path) == (tmp_path / "agent" / "weights", tmp_path / "agent" / "engines")
