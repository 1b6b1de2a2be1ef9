"""A control plane started again under running agents: its /health says it is recovering (503, "1 of 2 known nodes
reconnected") until the nodes connected before are back, and the agents come back within seconds (their reconnect
backoff is small and jittered), not after a 30 s backoff."""

from __future__ import annotations

import signal
import socket
from dataclasses import replace

import httpx
import pytest
import trio

from llmgw.cli.server_cmds import render_status
from llmgw.control.deciding import decide
from llmgw.control.recovering import KNOWN_NODES_KEY, decode_known, encode_known, recovery
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState
from llmgw.plan.types import NodeState
from llmgw.store import open_store

from support.llmgw_processes import LlmgwProcesses

from .test_decide_invariants import random_state
from .test_failover import Plane, wait_for


@pytest.mark.parametrize(
    "known, connected, now, done, text",
    [
        ((), (), 0.0, True, "ready"),
        (("n1", "n2"), ("n1", "n2", "n3"), 1.0, True, "ready"),
        (("n1", "n2"), ("n1",), 5.0, False, "recovering: 1 of 2 known nodes reconnected (at most 15 s more)"),
        (("n1", "n2"), (), 0.0, False, "recovering: 0 of 2 known nodes reconnected (at most 20 s more)"),
        (("n1", "n2"), ("n2",), 20.0, True, "ready (1 of 2 known nodes did not reconnect within 20 s: n1)"),
        (tuple(f"n{i}" for i in range(8)), (), 25.0, True,
         "ready (8 of 8 known nodes did not reconnect within 20 s: n0, n1, n2, n3, n4 and 3 more)"),
    ],
)
def test_recovery_waits_for_the_known_nodes_or_the_grace_period(known, connected, now, done, text):
    state = recovery(known, connected, started=0.0, now=now, grace=20.0)
    assert (state.done, state.text) == (done, text)


@pytest.mark.parametrize("value, ids", [
    (encode_known({"b", "a"}), {"a", "b"}), (None, set()), ("not json", set()), ('{"a": 1}', set()),
    ('["a", 3]', {"a"}),
])
def test_the_known_nodes_entry_reads_back_and_a_damaged_one_waits_for_nothing(value, ids):
    assert decode_known(value) == ids


def test_recovery_is_part_of_the_control_state_and_a_pass_latches_it_once_done():
    """The state of a started control plane says "recovering" until its known nodes have registered in its fleet;
    the pass after that keeps "ready" in the state, so a node that disconnects later does not bring it back; a
    timer wakes a pass when the grace ends."""
    base, now = random_state(3)
    nodes = [record.node_id for record in base.fleet.records()][:2]
    fleet = FleetRegistry(lost_after=30.0)
    state = replace(base, fleet=fleet, timers=()).recovering_from(frozenset(nodes), now, grace=20.0)
    assert state.timers == ((now + 20.0, "recovery grace over"),)
    assert state.recovery(now + 5).text == "recovering: 0 of 2 known nodes reconnected (at most 15 s more)"
    for node_id in nodes:
        fleet, _ = fleet.register(NodeState(node_id=node_id, cpu_cores=8, memory_bytes=16 << 30), now + 1)
    back = state.with_fleet(fleet)
    assert back.recovery(now + 2).text == "ready" and back.recovering.recovered is None
    _, passed = decide(back, now + 2)
    assert passed.recovering.recovered is not None
    gone, _ = fleet.disconnect(nodes[0], now + 3)
    assert passed.with_fleet(gone).recovery(now + 4).text == "ready"
    assert back.with_fleet(gone).recovery(now + 4).text.startswith("recovering: 1 of 2")  # not latched: waits again
    _, late = decide(back.with_fleet(gone), now + 21)
    assert late.recovery(now + 21).text == f"ready (1 of 2 known nodes did not reconnect within 20 s: {nodes[0]})"
    assert ControlState().recovery(0.0).text == "ready"  # nothing known: nothing to wait for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
async def test_a_restarted_control_plane_says_it_is_recovering_until_its_agents_are_back(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    state = tmp_path / "cp"
    ports = {name: _free_port() for name in ("gateway", "admin", "agents")}
    server = ["server", "--repo", str(settings_repo), "--state", str(state), "--lease", "3s",
              "--recovery-grace", "60s", *[a for name, port in ports.items() for a in (f"--{name}", f"127.0.0.1:{port}")]]
    procs = LlmgwProcesses(tmp_path)
    plane = Plane(state)
    gateway = f"http://127.0.0.1:{ports['gateway']}"

    def known_nodes() -> frozenset[str]:
        store = open_store(state / "llmgw.sqlite3")
        try:
            return decode_known(store.get(KNOWN_NODES_KEY))
        finally:
            store.close()

    async def health() -> httpx.Response:
        async with httpx.AsyncClient(timeout=5) as client:
            return await client.get(f"{gateway}/health")

    try:
        procs.spawn("cp", *server)
        await wait_for(plane.connect, 60, "the control plane")
        for node in ("n1", "n2"):
            procs.spawn(node, "agent", "--control-plane", f"127.0.0.1:{ports['agents']}", "--node-id", node,
                        "--state-dir", str(tmp_path / node), "--mirror", str(mirror), "--heartbeat-interval", "200ms",
                        "--insecure", "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit",
                        "--no-bandwidth-probe")
        await wait_for(lambda: trio.to_thread.run_sync(lambda: known_nodes() == {"n1", "n2"}), 60,
                       "the leader to keep both nodes in the store")
        assert (await health()).status_code == 200

        procs.procs["cp"].send_signal(signal.SIGKILL)
        procs.procs["cp"].wait()
        procs.procs["n2"].send_signal(signal.SIGSTOP)  # n2 cannot reconnect until it is continued
        procs.spawn("cp", *server)
        started = trio.current_time()

        async def one_of_two() -> httpx.Response | None:
            reply = await health()
            return reply if "1 of 2" in reply.json().get("fleet", "") else None

        reply = await wait_for(one_of_two, 60, "the restarted control plane to see n1 back")
        n1_back = trio.current_time() - started
        assert reply.status_code == 503 and reply.json()["status"] == "recovering", reply.text
        assert reply.json()["fleet"].startswith("recovering: 1 of 2 known nodes reconnected")
        await plane.connect()
        assert (await plane.health())["fleet"].startswith("recovering: 1 of 2")
        said = "\n".join(render_status(await plane.status()))
        assert "fleet       recovering: 1 of 2 known nodes reconnected" in said, said

        procs.procs["n2"].send_signal(signal.SIGCONT)
        continued = trio.current_time()

        async def ready() -> bool:
            reply = await health()
            return reply.status_code == 200 and reply.json()["status"] == "ok"

        await wait_for(ready, 30, "the restarted control plane to have both nodes back")
        n2_back = trio.current_time() - continued
        assert (await plane.health())["fleet"] == "ready"
        assert "fleet " not in "\n".join(render_status(await plane.status()))
        print(f"recovery: n1 back {n1_back:.1f} s after the restart began, n2 {n2_back:.1f} s after SIGCONT")
    finally:
        if "n2" in procs.procs and procs.procs["n2"].poll() is None:
            procs.procs["n2"].send_signal(signal.SIGCONT)
        await trio.to_thread.run_sync(procs.stop)
