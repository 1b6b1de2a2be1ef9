"""`llmgw restart` against a real control plane with an in-process agent run as `llmgw up` runs it
(`run_agent_restarting`): the agent restarts over its stream, its engine keeps its pid and the gateway answers
throughout; an agent too old for it is refused at once, naming the node and its version."""

from __future__ import annotations

import httpx
import pytest
import trio

from llmgw.agent import run_agent_restarting
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.restarting import restart_refusal
from llmgw.control.state import ControlState

from .conftest import stand_in_agent
from .loop_world import control_state
from .test_in_process_fleet import replica_states, wait_for


async def test_restart_keeps_engines_and_their_pids_serving_throughout(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        nursery.start_soon(run_agent_restarting, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 30, "tiny-0 ready")
        _record, api_key = plane.store.create_api_key("demo")
        await wait_for(lambda: plane.table.models["tiny"].replicas, 5, "a route to tiny")
        pid = plane.snapshot().fleet.get("n1").details["tiny-0/0"].pid
        answers: list[int] = []
        done = trio.Event()

        async def keep_asking() -> None:  # the gateway answers throughout the restart
            async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=10) as client:
                while not done.is_set():
                    reply = await client.post(
                        "/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                    answers.append(reply.status_code)
                    await trio.sleep(0.02)

        nursery.start_soon(keep_asking)
        await wait_for(lambda: len(answers) >= 3, 10, "requests flowing")
        events: list[dict] = []

        async def emit(event: dict) -> None:
            events.append(event)

        ok = await plane.restart(emit, control_plane=False)
        assert ok, events
        (node,) = [e for e in events if e["event"] == "node"]
        assert node["ok"] and node["pids_before"]["tiny-0/0"] == node["pids_after"]["tiny-0/0"] == pid
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 10, "tiny-0 ready again")
        before = len(answers)
        await wait_for(lambda: len(answers) >= before + 3, 10, "requests after the restart")
        done.set()
        assert set(answers) == {200}, answers
        assert plane.snapshot().fleet.get("n1").details["tiny-0/0"].pid == pid
        nursery.cancel_scope.cancel()


def test_an_agent_too_old_to_restart_over_its_stream_is_refused_naming_it_and_its_version(tmp_path):
    from llmgw.plan.types import NodeState

    state: ControlState = control_state(None, NodeState("old-node"), acked=False, features=("adopt", "logs"))
    assert restart_refusal(state, "old-node") == (
        "node old-node runs llmgw agent 0.1.0, which cannot restart over its stream; restart it on the node "
        "(or upgrade its agent)")
    assert restart_refusal(control_state(None, NodeState("new"), acked=False, features=("restart",)), "new") is None


@pytest.mark.slow
def test_llmgw_restart_brings_a_real_server_back_in_the_same_process(tmp_path, settings_repo, monkeypatch):
    """`llmgw restart` against a real `llmgw server`: no agents to restart, then the control plane re-executes
    itself (same pid) and serves again. The proof of the re-exec is what the new image does, not the ports: it logs
    the restart, then starts anew and rewrites `<state>/admin-url` (its port-0 listeners are bound anew, which may
    give a port it had before, so the URL itself need not change)."""
    import signal
    import time

    from click.testing import CliRunner

    from llmgw.cli.main import cli
    from support.llmgw_processes import LlmgwProcesses

    state = tmp_path / "state"
    url_file, log = state / "admin-url", tmp_path / "server.log"
    fleet = LlmgwProcesses(tmp_path)
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # kept through the re-exec: SIGABRT writes every thread's stack

    def wait(condition, seconds: float, what: str) -> None:  # polls; the deadline only bounds a failure
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:  # stuck or slow? the log says how far it got, the stacks where it is
                if server.poll() is None:
                    server.send_signal(signal.SIGABRT)
                    server.wait(10)
                raise AssertionError(f"no sign that {what} within {seconds} s; server log:\n{log.read_text()}")
            time.sleep(0.05)

    def written() -> int:  # when the admin-url was written (0: not yet): once per start of the control plane
        try:
            return url_file.stat().st_mtime_ns if url_file.read_text().strip() else 0
        except FileNotFoundError:
            return 0

    try:
        server = fleet.spawn("server", "server", "--repo", str(settings_repo), "--state", str(state),
                             "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0")
        wait(written, 90, "the server wrote its admin-url")
        first = written()
        done = CliRunner().invoke(cli, ["restart", "--state", str(state)])  # the command, not its interpreter
        assert done.exit_code == 0, done.output
        assert "the control plane restarts now" in done.output
        wait(lambda: written() != first, 90, "the re-executed server rewrote its admin-url")
        assert server.poll() is None  # the same process (pid), re-executed
        assert log.read_text().count("restarting the control plane (`llmgw restart`)") == 1
        after = url_file.read_text().strip()
        token = (state / "admin-token").read_text().strip()
        with httpx.Client(base_url=after, timeout=10, headers={"Authorization": f"Bearer {token}"}) as admin:

            def answers() -> bool:
                try:
                    return admin.get("/api/v1/status").status_code == 200
                except httpx.TransportError:
                    return False

            wait(answers, 60, "the restarted control plane answers")
    finally:
        fleet.stop()
