"""The agent refuses a command from an older leader-lease token than the newest it has seen, with a sentence, and
remembers the newest token across a restart."""

from __future__ import annotations

import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.fencing import Fence
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching


@pytest.mark.parametrize(("newest", "token", "after", "refused"), [
    (0, 0, 0, False),     # no leader token yet: a single control plane without fencing
    (0, 3, 3, False),     # the first token seen
    (3, 3, 3, False),     # the same leader again
    (3, 4, 4, False),     # a newer leader
    (4, 3, 4, True),      # a deposed leader
    (4, 0, 4, True),      # no token at all, once one was seen
])
def test_a_fence_admits_the_newest_token_and_refuses_older_ones(newest, token, after, refused):
    fence, refusal = Fence(newest).admit(token)
    assert fence.newest == after
    assert (refusal is not None) == refused
    if refused:
        assert f"token {token}, older than token {newest}" in refusal and "deposed leader" in refusal


async def _settings(link, command_id: str, token: int, interval: float) -> pb.CommandResult:
    await link.send(control_message(command_id=command_id, fencing_token=token,
                                    agent_settings=pb.AgentSettings(heartbeat_interval=interval)))
    message = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result"
                                  and m.command_result.command_id == command_id)
    return message.command_result


async def test_a_command_from_a_deposed_leader_is_refused_even_after_the_agent_restarts(tmp_path):
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=5.0)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        await link.receive()  # Register
        assert (await _settings(link, "new", 7, 2.0)).ok
        late = await _settings(link, "late", 6, 9.0)
        assert not late.ok and "token 6, older than token 7" in late.error and "deposed leader" in late.error
        assert agent.config.heartbeat_interval == 2.0  # the late command did nothing
        nursery.cancel_scope.cancel()

    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        await link.receive()
        assert not (await _settings(link, "late-again", 6, 9.0)).ok
        assert (await _settings(link, "newer", 8, 3.0)).ok
        nursery.cancel_scope.cancel()
