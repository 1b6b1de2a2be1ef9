"""Mixed versions during an upgrade (issue 30): an older agent beside a newer control plane is served what it can do
and nothing else, and an agent newer than the control plane is refused with a sentence that ends it.

Two kinds of older agent. The previous release's own agent (`tests/support/previous_release.py`: its commit's
llmgw/ extracted with git archive) as an `llmgw agent` process over gRPC: it registers with this control plane and
its replica is started, and every message the control plane sends it needs only what its Register listed. And, for
an agent that lacks features (the previous release lists the same ones as this tree), this tree's agent with the
feature list and version of an older one (`reporting.FEATURES` and `__version__` replaced), in process: building
an agent of an older commit with fewer features would cost a release build per run, and what the control plane
decides from is exactly what Register says. A real control plane, the engine a stand-in."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest
import trio

from llmgw.agent import commands, reporting, run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.sessions import AgentSession
from llmgw.errors import AgentRefused, UsageError
from llmgw.groups import leaves
from llmgw.settings.model import Listener
from llmgw.wire.features import BASE_KINDS, KIND_FEATURES, lacking
from support.previous_release import PREVIOUS_RELEASE, previous_tree

from .conftest import stand_in_agent
from .test_in_process_fleet import replica_states, wait_for

OLDER = ("adopt", "install:llama.cpp", "weights:mirror", "weights:https")
"""An older agent's features: no logs, restart, fabric test, ignore_gpus, hf:// weights, vLLM or SGLang."""


def older_agent(monkeypatch, features: tuple[str, ...] = OLDER, version: str = "0.0.9") -> list[str]:
    """Make this process's agent register as an older one; returns the ControlMessage kinds it receives."""
    monkeypatch.setattr(reporting, "FEATURES", features)
    monkeypatch.setattr(reporting, "__version__", version)
    received: list[str] = []
    handle = commands.handle

    async def recording(agent, message, link) -> None:
        received.append(message.WhichOneof("body"))
        await handle(agent, message, link)

    monkeypatch.setattr(commands, "handle", recording)
    return received


async def test_an_older_agent_is_served_what_it_lists_and_nothing_else(
        tmp_path, settings_repo, weights_mirror, fake_engine, monkeypatch):
    received = older_agent(monkeypatch)
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        nursery.start_soon(run_agent, stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine),
                           plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 30, "tiny-0 ready on the older agent")
        node = plane.status()["nodes"]["n1"]
        assert node["agent_version"] == "0.0.9"
        assert {"logs", "restart", "agent_settings.ignore_gpus", "weights:hf"} <= set(node["lacks"])
        events: list[dict] = []

        async def emit(event: dict) -> None:
            events.append(event)

        assert not await plane.restart(emit, control_plane=False)
        assert events == [{"event": "node", "node": "n1", "ok": False, "message": (
            "node n1 runs llmgw agent 0.0.9, which cannot restart over its stream; restart it on the node (or "
            "upgrade its agent)")}]
        with pytest.raises(UsageError, match=r"node n1 runs llmgw agent 0\.0\.9, which cannot take request_logs "
                                             r"\(it lacks 'logs'\); upgrade its agent\."):
            await plane.agents.logs("n1", "", 10)
        nursery.cancel_scope.cancel()
    listed = BASE_KINDS | {kind for kind, feature in KIND_FEATURES.items() if feature in OLDER}
    assert "start_shard" in received and "registered" in received
    assert set(received) <= listed, f"sent what the agent does not list: {set(received) - listed}"


async def test_an_action_the_older_agent_cannot_do_is_not_sent_and_status_says_why(
        tmp_path, settings_repo, weights_mirror, fake_engine, monkeypatch):
    received = older_agent(monkeypatch, features=("adopt", "install:llama.cpp", "weights:mirror"))
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    why = ("node n1 runs llmgw agent 0.0.9, which cannot start tiny-0 (it lacks 'weights:https'); upgrade its "
           "agent")
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        nursery.start_soon(run_agent, stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine),
                           plane.local_connector())

        def refused() -> list:
            return (plane.status().get("pass") or {}).get("refused", [])

        await wait_for(refused, 30, "a refused start in the pass's status")
        assert refused() == [{"kind": "start", "node": "n1", "subject": "tiny-0/0", "error": why}]
        nursery.cancel_scope.cancel()
    assert "start_shard" not in received


async def test_an_agent_newer_than_the_control_plane_is_refused_and_ends_saying_to_upgrade_the_control_plane(
        tmp_path, settings_repo, weights_mirror, fake_engine, monkeypatch, caplog):
    older_agent(monkeypatch, features=reporting.FEATURES, version="9.9.9")
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    caplog.set_level(logging.INFO, "llmgw")
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        with trio.fail_after(30), pytest.raises(BaseException) as ended:
            await run_agent(stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine), plane.local_connector())
        assert plane.snapshot().fleet.get("n1") is None, "a refused agent is not registered"
        nursery.cancel_scope.cancel()
    (refusal,) = [e for e in leaves(ended.value) if isinstance(e, AgentRefused)]
    assert str(refusal) == (
        "the control plane (llmgw 0.1.0) refused this agent: node n1 runs llmgw agent 9.9.9, newer than this control "
        "plane's llmgw 0.1.0; upgrade the control plane first (llmgw 9.9.9 or newer), then start the agent again: "
        "control planes go first in an upgrade.")
    agent_lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.agent" and r.levelno == logging.ERROR]
    assert any("upgrade the control plane first" in line for line in agent_lines), agent_lines


async def test_the_previous_release_s_agent_is_served_by_this_control_plane_only_what_it_lists(
        tmp_path, settings_repo, weights_mirror, fake_engine, monkeypatch):
    sent: list[tuple[str, str, tuple[str, ...]]] = []  # (node, kind, features it lacks) of every message sent
    send = AgentSession.send

    async def recording(session, message) -> None:
        sent.append((session.node_id, message.WhichOneof("body"), lacking(message, session.features)))
        await send(session, message)

    monkeypatch.setattr(AgentSession, "send", recording)
    tree = previous_tree(tmp_path / "previous")
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state",
                                       agents_listener=Listener("127.0.0.1", 0)))
    log = tmp_path / "previous-agent.log"
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        with open(log, "wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "llmgw.cli", "agent", "--control-plane", f"127.0.0.1:{plane.agents_port}",
                 "--node-id", "old", "--state-dir", str(tmp_path / "old"), "--mirror", str(mirror),
                 "--heartbeat-interval", "200ms", "--insecure", "--engine-binary",
                 f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit"],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 90,
                           f"tiny-0 ready on the agent of {PREVIOUS_RELEASE[:12]}", lambda: log.read_text()[-3000:])
            record = plane.snapshot().fleet.get("old")
            assert record.connected and record.features, "the previous release's agent lists its features"
        finally:
            agent.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(agent.wait, 30)
            nursery.cancel_scope.cancel()
    assert {kind for node, kind, _ in sent if node == "old"} >= {"registered", "start_shard"}
    assert [(kind, missing) for node, kind, missing in sent if missing] == []
