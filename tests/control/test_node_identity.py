"""A node id belongs to the node that first registered it with its node secret (issue 25, item 1).

Before, any process that reached the agents port on loopback (`llmgw up`) or one served `--insecure` could register
as a connected node id, replace its session and receive its replica keys and the munge key. Now every Register
proves its node secret (kept 0600 in the agent's state directory; the control plane keeps its SHA-256 in the
store, recorded on first use), on plain text and the in-process link alike; over mutual TLS the certificate does.
"""

from __future__ import annotations

import functools
import logging
import stat

import pytest
import trio
from click.testing import CliRunner

from llmgw.agent import run_agent
from llmgw.agent.node_secret import SECRET_FILE, load_or_create_secret
from llmgw.cli.main import cli as llmgw_cli
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.agents import AgentHub
from llmgw.control.node_identity import NodeIdentities, identity_key, judge
from llmgw.errors import StoreError, UsageError, WireError
from llmgw.store import SqliteStore
from llmgw.wire import agent_message, connect, memory_link_pair, pb

from .conftest import stand_in_agent
from .test_in_process_fleet import wait_for


def register(node_id: str, secret: str = "", address: str = "10.0.0.9") -> pb.AgentMessage:
    return agent_message(register=pb.Register(node_id=node_id, address=address, cpu_cores=2,
                                              memory_total_bytes=1 << 30, node_secret=secret))


async def refusal(link) -> str:
    """The sentence a refused Register's stream ends with (never a Registered first)."""
    with pytest.raises(WireError) as caught:
        with trio.fail_after(10):
            await link.receive()
    return str(caught.value)


async def test_a_second_register_for_a_connected_node_id_needs_its_secret_and_the_restarted_agent_has_it(
        tmp_path, settings_repo):
    """Real gRPC on loopback (plain text, as `llmgw up` serves agents): the node's own agent registers with the
    secret it made in its state directory; another process registering as that node id without it, or with
    another secret, is refused with a sentence and the node's session stays; the agent restarted on the same
    state directory reads the same secret and is accepted."""
    agent_state = tmp_path / "agent"
    secret = load_or_create_secret(agent_state)
    assert stat.S_IMODE((agent_state / SECRET_FILE).stat().st_mode) == 0o600
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        address = f"127.0.0.1:{plane.agents_port}"
        async with connect(address) as node:
            await node.send(register("n1", secret))
            assert (await node.receive()).WhichOneof("body") == "registered"
            await wait_for(lambda: plane.is_connected("n1"), 5, "the node connected")
            session = plane.agents.sessions["n1"]

            async with connect(address) as intruder:
                await intruder.send(register("n1", address="10.6.6.6"))
                sentence = await refusal(intruder)
            assert "node 'n1' sent no node secret" in sentence and "upgrade llmgw" in sentence
            async with connect(address) as intruder:
                await intruder.send(register("n1", "w" * 43, address="10.6.6.6"))
                sentence = await refusal(intruder)
            assert "node 'n1' is already known with another node secret" in sentence
            assert "llmgw node forget-identity n1" in sentence
            assert plane.agents.sessions.get("n1") is session
            assert plane.registry.get("n1").state.address == "10.0.0.9"

        await wait_for(lambda: not plane.is_connected("n1"), 5, "the node's stream ended")
        assert load_or_create_secret(agent_state) == secret  # the agent restarted: the same state directory
        async with connect(address) as node:
            await node.send(register("n1", secret))
            assert (await node.receive()).WhichOneof("body") == "registered"
            await wait_for(lambda: plane.is_connected("n1"), 5, "the restarted node connected")
        nursery.cancel_scope.cancel()


async def test_the_real_agent_restarted_on_its_state_directory_is_accepted_and_an_impostor_agent_is_not(
        tmp_path, settings_repo, weights_mirror, fake_engine, caplog):
    """Real agents over real gRPC on loopback: one with another state directory (another secret) registering as
    the connected node id logs the refusal and never becomes its session; the node's own agent, stopped and
    started again on its state directory, is accepted."""
    caplog.set_level(logging.INFO)
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))

    def agent(state: str):
        config = stand_in_agent("n1", tmp_path / state, weights_mirror[0], fake_engine)
        return functools.partial(run_agent, config, lambda: connect(f"127.0.0.1:{plane.agents_port}"), nvml=None)

    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with trio.open_nursery() as first:
            await first.start(agent("agent"))
            await wait_for(lambda: plane.is_connected("n1"), 15, "the node's agent connected")
            session = plane.agents.sessions["n1"]
            async with trio.open_nursery() as impostor:
                await impostor.start(agent("impostor"))
                await wait_for(lambda: any(  # the impostor agent's own log line says why
                    "the link to the control plane failed" in r.getMessage()
                    and "already known with another node secret" in r.getMessage() for r in caplog.records), 15,
                    "the impostor's refusal logged by its agent")
                impostor.cancel_scope.cancel()
            assert plane.agents.sessions["n1"] is session
            first.cancel_scope.cancel()
        await wait_for(lambda: not plane.is_connected("n1"), 15, "the node's agent gone")
        async with trio.open_nursery() as again:
            await again.start(agent("agent"))
            await wait_for(lambda: plane.is_connected("n1"), 15, "the restarted agent connected")
            again.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_the_in_process_link_of_llmgw_up_proves_the_node_too():
    """`llmgw up`'s agent talks over a memory link: a second Register there is held to the same rule."""
    hub = AgentHub(lambda transition, reason=None, origin_unix=None: None)
    async with trio.open_nursery() as nursery:
        hub.nursery = nursery
        agent, control = memory_link_pair()
        nursery.start_soon(hub.accept, control, "memory")
        await agent.send(register("n1", "s" * 43))
        assert (await agent.receive()).WhichOneof("body") == "registered"
        session = hub.sessions["n1"]
        other, other_control = memory_link_pair()
        await other.send(register("n1", "t" * 43))
        with pytest.raises(WireError, match="already known with another node secret"), trio.fail_after(10):
            await hub.accept(other_control, "memory")
        assert hub.sessions["n1"] is session
        nursery.cancel_scope.cancel()


def test_the_secret_is_made_once_kept_0600_and_narrowed_when_others_could_read_it(tmp_path):
    secret = load_or_create_secret(tmp_path)
    assert len(secret) == 43 and load_or_create_secret(tmp_path) == secret
    path = tmp_path / SECRET_FILE
    path.chmod(0o644)
    assert load_or_create_secret(tmp_path) == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    with pytest.raises(UsageError, match="does not hold a node secret"):
        load_or_create_secret(tmp_path)


def test_the_store_keeps_only_a_hash_across_control_planes_and_forgetting_lets_a_new_secret_in(tmp_path):
    """Two control planes on one store (or one restarted) know the same identities; `llmgw node forget-identity`
    lets a node with a new state directory in."""
    url = tmp_path / "llmgw.sqlite3"
    first, second = SqliteStore(url), SqliteStore(url)
    try:
        trio.run(NodeIdentities(first).prove, "n1", "a" * 43, False)
        stored = second.get(identity_key("n1"))
        assert "a" * 43 not in stored and '"by": "first use"' in stored
        with pytest.raises(WireError, match="already known"):
            trio.run(NodeIdentities(second).prove, "n1", "b" * 43, False)
        trio.run(NodeIdentities(second).prove, "n1", "a" * 43, False)
    finally:
        first.close()
        second.close()
    result = CliRunner().invoke(llmgw_cli, ["node", "forget-identity", "n1", "--store", str(url)])
    assert result.exit_code == 0 and "forgot the node secret of node 'n1'" in result.output
    store = SqliteStore(url)
    try:
        trio.run(NodeIdentities(store).prove, "n1", "b" * 43, False)
        with pytest.raises(WireError, match="already known"):
            trio.run(NodeIdentities(store).prove, "n1", "a" * 43, False)
    finally:
        store.close()


def test_the_rules_of_judge():
    secret, other = "a" * 43, "b" * 43
    first = judge("n1", None, secret, False, 1.0)
    assert first.refusal is None and first.record is not None
    assert judge("n1", first.record, secret, False, 2.0) == judge("n1", first.record, secret, True, 2.0)
    assert judge("n1", first.record, secret, False, 2.0).record is None
    assert judge("n1", "", secret, False, 2.0).record is not None  # forgotten: recorded again
    assert judge("n1", first.record, other, False, 2.0).refusal
    assert judge("n1", "{damaged", secret, False, 2.0).refusal  # a damaged record lets nobody in
    vouched = judge("n1", first.record, other, True, 2.0)  # the certificate vouches for a new secret
    assert vouched.refusal is None and '"by": "certificate"' in vouched.record
    assert judge("n1", first.record, "", True, 2.0).refusal is None  # an older agent over mutual TLS
    assert "sent no node secret" in judge("n1", None, "", False, 2.0).refusal
    assert "is not one" in judge("n1", None, "short", False, 2.0).refusal
    assert "is not one" in judge("n1", None, "a\n" * 20, False, 2.0).refusal


def test_a_store_that_fails_ends_the_stream_with_a_sentence_and_lets_nobody_in():
    class Down:
        def get(self, key):
            raise StoreError("the database is gone")

    with pytest.raises(WireError, match="cannot check the identity of node 'n1' now .*the database is gone"):
        trio.run(NodeIdentities(Down()).prove, "n1", "a" * 43, False)
