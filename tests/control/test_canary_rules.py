"""When new settings start, keep or end a canary (`canaries_for_settings`), and what a canary's state tells the
planner and the routing table (`holds_of`, `route_canaries`). Pure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.control.canaries import canaries_for_settings, canary_line, holds_of, route_canaries
from llmgw.control.state import CanaryPhase
from llmgw.settings import load_directory
from llmgw.settings.model import Prices, Rollout

from .conftest import write_seed

CANARY = Rollout("canary", share=0.2, window=60.0, min_requests=5, max_ttft_p90=1.0)


@pytest.fixture
def base(tmp_path: Path):
    return replace(load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=2)), commit="a" * 40)


def edit(settings, commit: str, **changes):
    return replace(settings, commit=commit * 40, models={"tiny": replace(settings.models["tiny"], **changes)})


def test_a_change_that_restarts_replicas_under_a_canary_rollout_starts_a_canary_on_the_first_replica(base):
    slow = edit(base, "b", engine_args=("--threads", "1"), rollout=CANARY)
    canaries = canaries_for_settings({}, base, slow)
    canary = canaries["tiny"]
    assert (canary.commit, canary.previous_commit, canary.replica_id, canary.phase) == (
        "b" * 40, "a" * 40, "tiny-0", CanaryPhase.RUNNING)
    assert canary.previous == base.models["tiny"]
    assert holds_of(canaries)["tiny"].replica_id == "tiny-0" and not holds_of(canaries)["tiny"].failed
    assert route_canaries(canaries) == {"tiny": (canary.fingerprint, 0.2)}
    assert canary_line(canary) == "canary of tiny at bbbbbbbbbbbb (tiny-0, 0.2 of requests) starting"

    # a price changes nothing; a revert ends it; another revision tries again against the same old replicas
    priced = edit(slow, "c", prices=Prices(1.0, 2.0))
    assert canaries_for_settings(canaries, slow, priced) is canaries
    assert canaries_for_settings(canaries, slow, edit(base, "d", rollout=CANARY)) == {}
    failed = {"tiny": replace(canary, phase=CanaryPhase.FAILED, reason="slow")}
    assert route_canaries(failed) == {"tiny": (canary.fingerprint, 0.0)}
    assert holds_of(failed)["tiny"].previous == base.models["tiny"]
    again = canaries_for_settings(failed, slow, edit(base, "e", engine_args=("--threads", "2"), rollout=CANARY))
    assert again["tiny"].previous == base.models["tiny"] and again["tiny"].previous_commit == "a" * 40
    assert again["tiny"].commit == "e" * 40 and again["tiny"].phase is CanaryPhase.RUNNING
    held = {"tiny": replace(canary, phase=CanaryPhase.HELD)}
    assert holds_of(held) == {} and route_canaries(held) == {}
    # once it held, the next revision is tried against the one it rolled out
    later = canaries_for_settings(held, slow, edit(base, "f", engine_args=("--threads", "3"), rollout=CANARY))
    assert later["tiny"].previous == slow.models["tiny"] and later["tiny"].previous_commit == "b" * 40
    assert canaries_for_settings(held, slow, priced) is held


@pytest.mark.parametrize("changes, before_none", [
    ({"engine_args": ("--threads", "1")}, False),                   # rolling: no canary
    ({"prices": Prices(1.0, 1.0), "rollout": CANARY}, False),       # nothing restarts
    ({"engine_args": ("--threads", "1"), "rollout": CANARY}, True),  # nothing ran before (a control plane start)
    ({"engine_args": ("--threads", "1"), "rollout": CANARY, "replicas": 0}, False),  # scaled to none
])
def test_no_canary_starts_where_there_is_nothing_to_compare(base, changes, before_none):
    assert canaries_for_settings({}, None if before_none else base, edit(base, "b", **changes)) == {}


def test_a_control_plane_started_before_the_fleet_converged_starts_the_canary_against_the_applied_commit(base):
    from llmgw.control.events import settings_published
    from llmgw.control.state import ControlState, WatchState

    slow = edit(base, "b", engine_args=("--threads", "1"), rollout=CANARY)
    state, _ = settings_published(WatchState(settings=slow, applied=base), None)(ControlState())
    assert state.canaries["tiny"].previous_commit == "a" * 40 and state.canaries["tiny"].commit == "b" * 40
    state, _ = settings_published(WatchState(settings=slow), None)(ControlState())
    assert state.canaries == {}  # the head is what was applied: nothing to compare
