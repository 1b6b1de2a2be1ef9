"""An agent connects to every control plane it is given and to each one the settings add (AgentSettings
control_planes), registers with each, and sends each its own heartbeats."""

from __future__ import annotations

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching


def _is(kind: str):
    return lambda m: m.WhichOneof("body") == kind


async def test_an_agent_registers_with_every_control_plane_including_one_the_settings_add(tmp_path):
    sides = {"a:1": ControlSide(), "b:2": ControlSide(), "c:3": ControlSide()}
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.1,
                         control_planes=("a:1", "b:2"))
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, connect_to=lambda address: sides[address].connect,
                                                          task_status=task_status))
        a = await sides["a:1"].links.receive()
        b = await sides["b:2"].links.receive()
        assert (await a.receive()).register.node_id == "n" and (await b.receive()).register.node_id == "n"
        await next_matching(b, _is("heartbeat"))  # each control plane gets heartbeats of its own
        await a.send(control_message(command_id="s", fencing_token=1, agent_settings=pb.AgentSettings(
            control_planes=["a:1", "b:2", "c:3"])))
        result = await next_matching(a, _is("command_result"))
        assert result.command_result.ok
        # the answer reaches every control plane (only the sender waits for its id)
        assert (await next_matching(b, _is("command_result"))).command_result.command_id == "s"
        c = await sides["c:3"].links.receive()
        assert (await c.receive()).register.node_id == "n"
        beats = 0
        with trio.move_on_after(1.0):
            while True:
                if (await a.receive()).WhichOneof("body") == "heartbeat":
                    beats += 1
        assert 5 <= beats <= 15  # every 0.1 s on this connection: not tripled by the other two
        nursery.cancel_scope.cancel()
    assert sides["a:1"].links.statistics().current_buffer_used == 0  # no second connection to a known plane
