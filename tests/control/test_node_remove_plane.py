"""`llmgw node remove NODE` against a running control plane with an in-process agent serving the llama-server
stand-in (the control plane's side: `--keep-machine`, and the wipe over the agent's stream of an install journal of the
test's own; on a real host: tests/install/test_node_add.py).

It refuses a node that still serves once drained (its replica has nowhere else to go), and one the control plane does
not know; once the agent stopped, it forgets the node: no record, its node secret gone."""

from __future__ import annotations

import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.node_identity import identity_key
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .test_cli_over_admin_api import llmgw
from .test_in_process_fleet import wait_for

WHO = ("--author-name", "Ada", "--author-email", "ada@example.com")


async def test_node_remove_refuses_a_node_that_still_serves_and_forgets_one_whose_agent_stopped(
        tmp_path, weights_mirror, fake_engine) -> None:
    mirror, sha = weights_mirror
    repo = tmp_path / "settings.git"
    init_repository(repo, write_seed(tmp_path / "seed", sha))
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent_scope = trio.CancelScope()

        async def agent(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with agent_scope:
                await run_agent(stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine), plane.local_connector(),
                                task_status=task_status)

        await nursery.start(agent)
        code, out, err = await llmgw(plane, "apply", "--timeout", "30")
        assert code == 0, out + err

        code, out, err = await llmgw(plane, "node", "remove", "n1", "--drain-timeout", "1", *WHO)
        assert code == 1, out + err
        assert out.startswith("[n1] drained (settings at ")
        assert err.strip() == ("error: node n1 still serves tiny-0/0 (replica tiny-0, ready) after 1 s of draining "
                               "(`llmgw status` says where its replicas wait to be placed). It stays drained and "
                               "nothing was removed: run `llmgw node remove n1` again once they moved, or add --force "
                               "to remove it while it serves (its requests in flight fail)")
        assert plane.status()["nodes"]["n1"]["state"] == "connected"

        code, out, err = await llmgw(plane, "node", "remove", "ghost", *WHO)
        assert (code, err.strip()) == (1, "error: the control plane knows no node 'ghost' (`llmgw nodes` lists them): "
                                          "nothing was removed")

        assert plane.agents.identities.store.get(identity_key("n1"))  # recorded at its Register
        agent_scope.cancel()  # as `llmgw wipe --stop-agent` on its machine would
        await wait_for(lambda: plane.status()["nodes"]["n1"]["state"] != "connected", 10, "n1's stream ended")
        code, out, err = await llmgw(plane, "node", "remove", "n1", "--force", "--drain-timeout", "0", *WHO)
        assert (code, out) == (1, "")  # its agent cannot wipe the machine: nothing is done, not even the drain
        assert err.strip().startswith("error: node n1 is disconnected, so its agent cannot wipe its machine over its "
                                      "stream: start its agent there and run this again, or add --over-ssh ")
        code, out, err = await llmgw(plane, "node", "remove", "n1", "--keep-machine", "--force", "--drain-timeout",
                                     "0", *WHO)
        assert code == 0, out + err
        lines = out.splitlines()  # its last report may still list the replica's shard: --force goes on then
        assert lines[-2] == "[n1] the machine is left as it is (--keep-machine)"
        assert lines[-1] == ("node n1 removed: 0 certificates revoked, node secret forgotten; it joins again only "
                            "with a new join token (`llmgw node add`). The settings keep it drained (`llmgw node "
                            "uncordon n1` lifts it).")
        assert "n1" not in plane.status()["nodes"]
        assert not plane.agents.identities.store.get(identity_key("n1"))
        nursery.cancel_scope.cancel()


async def test_node_remove_wipes_the_machine_over_the_agents_stream_and_the_agent_stops(
        tmp_path, weights_mirror, fake_engine) -> None:
    """The WipeNode effect, its handler and the agent's command: the agent's engine stopped, its install journal
    (here a directory and a file of the test's own) undone, what it removed shown, the agent stopped by itself
    (`run_agent` returns "wiped"), then the node forgotten."""
    from llmgw.install import Journal

    mirror, sha = weights_mirror
    repo = tmp_path / "settings.git"
    init_repository(repo, write_seed(tmp_path / "seed", sha))
    journal = Journal.open(tmp_path / "host" / "journal.json")
    journal.make_dirs(tmp_path / "host" / "opt")
    journal.write_file(tmp_path / "host" / "etc" / "agent.env", b"X=1\n")
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    ended = []
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)

        async def agent(task_status=trio.TASK_STATUS_IGNORED) -> None:
            config = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine, install_journal=journal.path)
            ended.append(await run_agent(config, plane.local_connector(), task_status=task_status))

        serving = await nursery.start(agent)
        code, out, err = await llmgw(plane, "apply", "--timeout", "30")
        assert code == 0, out + err
        assert serving.supervisor.get("tiny-0/0") is not None
        code, out, err = await llmgw(plane, "node", "remove", "n1", "--drain-timeout", "1", "--force", *WHO)
        assert code == 0, out + err
        lines = out.splitlines()
        assert lines[1] == "[n1] still serves tiny-0/0 (replica tiny-0, ready): going on (--force)"
        assert lines[2] == f"[n1] {journal.path} lists 4 things llmgw made on this machine (newest first):"
        assert lines[-2] == "[n1] wiped: 4 removed or restored, 0 already gone; no journal left"
        assert lines[-1].startswith("node n1 removed: 0 certificates revoked, node secret forgotten; ")
        assert ended == ["wiped"] and not (tmp_path / "host").exists()
        assert serving.supervisor.get("tiny-0/0") is None  # its engine was stopped before the wipe
        assert "n1" not in plane.status()["nodes"]
        nursery.cancel_scope.cancel()
