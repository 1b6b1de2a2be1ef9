"""Fleet scale: a replica being started is not started again elsewhere, the audit backlog collapses, and
bench/fleet_scale.py keeps running (its --quick mode against a real `llmgw server`)."""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.control.audit import _Write, coalesced
from llmgw.control.deciding import decide
from llmgw.plan.types import ActionKind, NodeState
from llmgw.settings import load_directory

from .conftest import write_seed
from .loop_world import control_state

ROOT = Path(__file__).resolve().parents[2]


def node(node_id: str) -> NodeState:
    return NodeState(node_id, cpu_cores=4, memory_bytes=8 << 30, engines_installed=frozenset({"llama.cpp@b11434"}))


def test_a_replica_whose_start_is_in_flight_is_not_placed_on_a_node_that_joins_before_its_report(tmp_path):
    settings = load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=2))
    first, state = decide(control_state(settings, node("n1")), 0.0)
    assert [(a.kind, a.node_id) for a in first.send] == [(ActionKind.START, "n1")] * 2
    joined = control_state(settings, node("n1"), node("n2"))  # n2 registers before n1 reports the shard
    second, _ = decide(replace(joined, in_flight=state.in_flight, passes=state.passes), 1.0)
    assert second.send == ()
    assert [(a.kind, a.node_id, a.outcome) for a in second.record.actions] == [("start", "n1", "in flight")] * 2


def test_audit_commits_waiting_one_behind_the_other_become_one_commit_of_the_newest_status():
    queue = deque([_Write({"n": 1}, "pass 1: a\n"), _Write({"n": 2}, "pass 2: b\n"), _Write(None, "", applied="c"),
                   _Write({"n": 3}, "pass 3: c\n")])
    item, taken = coalesced(queue)
    assert taken == 2 and item.status == {"n": 2}
    assert item.message.startswith("pass 2 (and 1 earlier passes): a; b\n\n") and "pass 1: a" in item.message
    assert coalesced(deque([_Write(None, "", applied="c")]))[1] == 1


@pytest.mark.slow
def test_the_fleet_scale_benchmark_runs_its_quick_mode_against_a_real_server():
    # that the benchmark runs end to end (its figures are for a quiet machine): short windows
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "fleet_scale.py"), "--quick", "--timeout", "240",
                           "--duration", "2", "--interval", "1", "--gateway-seconds", "1"],
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    header, row = done.stdout.strip().splitlines()[-2:]
    assert header.split()[0] == "agents" and row.split()[0] == "50"
