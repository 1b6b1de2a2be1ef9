"""A node whose agent restarts (or comes back after being lost) reports the engines it still runs: they are
adopted as they are, never restarted."""

from __future__ import annotations

import os
import signal

import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent
from .test_in_process_fleet import replica_states, wait_for


async def test_a_returning_node_has_its_running_engines_adopted_not_restarted(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _ = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine, stop_shards_on_exit=False)
    pid = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            async with trio.open_nursery() as first_agent:
                first_agent.start_soon(run_agent, agent, plane.local_connector())
                await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 30, "tiny-0 ready")
                pid = plane.status()["nodes"]["n1"]["shards"]["tiny-0/0"]["pid"]
                first_agent.cancel_scope.cancel()
            # the agent is gone (its engine is not); wait until the node is lost and the replica unplaced
            await wait_for(lambda: plane.status()["nodes"]["n1"]["state"] == "lost", 10, "n1 lost")
            starts_before = sum(1 for p in plane.passes for a in p.sent if a.kind == "start")
            await nursery.start(run_agent, agent, plane.local_connector())
            await wait_for(lambda: plane.status()["nodes"]["n1"]["state"] == "connected"
                           and replica_states(plane).get("tiny-0") == "ready" and plane.snapshot().last_pass.converged,
                           20, "n1 back and converged", plane.status)
            assert plane.status()["nodes"]["n1"]["shards"]["tiny-0/0"]["pid"] == pid
            starts_after = sum(1 for p in plane.passes for a in p.sent if a.kind == "start")
            assert starts_after == starts_before  # adopted: no StartShard was sent
            nursery.cancel_scope.cancel()
    finally:
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
