"""AgentSettings from the control plane are kept under the state directory and applied by the next agent at start,
before it reaches the control plane again."""

from __future__ import annotations

import logging

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.config import SETTINGS_FILE
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching


def _config(tmp_path) -> AgentConfig:
    return AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=5.0, labels={"rack": "r1"})


async def _beat_gap(link) -> float:
    """Seconds between two heartbeats as the control plane receives them."""
    await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")
    start = trio.current_time()
    await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")
    return trio.current_time() - start


async def test_settings_sent_to_one_agent_are_applied_by_the_next_one_at_start(tmp_path):
    config = _config(tmp_path)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        assert dict((await link.receive()).register.labels) == {"rack": "r1"}
        await link.send(control_message(command_id="s1", agent_settings=pb.AgentSettings(
            heartbeat_interval=0.2, labels={"zone": "z9"}, mirrors=[str(tmp_path / "mirror")],
            weights_dir="big-disk/weights")))
        result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result")
        assert result.command_result.ok
        nursery.cancel_scope.cancel()

    control = ControlSide()  # a new agent process would start from the same configuration and state directory
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        register = (await link.receive()).register
        assert dict(register.labels) == {"zone": "z9"}
        assert agent.config.mirrors == (str(tmp_path / "mirror"),)
        assert agent.config.weights_path == tmp_path / "state" / "big-disk" / "weights"
        assert await _beat_gap(link) < 1.0  # every 0.2 s, not the configured 5 s
        nursery.cancel_scope.cancel()


async def test_damaged_saved_settings_are_ignored_with_a_warning(tmp_path, caplog):
    config = _config(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / SETTINGS_FILE).write_bytes(b"\xff\xff\xff not protobuf")
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        assert dict((await link.receive()).register.labels) == {"rack": "r1"}
        nursery.cancel_scope.cancel()
    assert any(r.levelno == logging.WARNING and "saved agent settings" in r.getMessage() and "damaged" in r.getMessage()
               for r in caplog.records)
