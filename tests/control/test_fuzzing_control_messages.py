"""A hypothesis fuzzer of what the control plane sends an agent: any ControlMessage, in any order, crashes
nothing and hangs nothing on the agent (issue 19, item 10).

One agent runs in a trio thread for the module, its stream a memory link whose control end the test holds (the
bytes are serialized as over gRPC). Each example sends fuzzed ControlMessages on the stream, then asks for the
agent's log lines: the agent must still run and answer within EXAMPLE_SECONDS (over a new stream when the example
made it reconnect, e.g. by a Restart; a Registered's refusal, which ends the agent by design, is cleared). Paths and URLs in the messages are pointed at nowhere first (an AgentSettings
may name any directory, a StartShard or InstallEngine any URL; the agent would create or fetch them), so examples
touch neither the machine's files nor the network. FAST_EXAMPLES in the fast suite, SLOW_EXAMPLES under `-m slow`.
"""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.agent import AgentConfig
from llmgw.agent.runtime import run_agent_restarting
from llmgw.errors import WireError
from llmgw.wire import control_message, memory_link_pair, pb

from .protobuf_strategies import messages

FAST_EXAMPLES = 30
SLOW_EXAMPLES = 600
EXAMPLE_SECONDS = 15.0
NOWHERE = "file:///nonexistent/llmgw-fuzz"


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-agent")
    config = AgentConfig(node_id="fuzzed", state_dir=root / "agent", heartbeat_interval=0.5,
                         reconnect_backoff_max=0.2, stop_shards_on_exit=True, shard_stop_grace=1.0)
    ready = threading.Event()
    box: dict = {"errors": [], "link": None}

    async def main() -> None:
        send_links, receive_links = trio.open_memory_channel(10)

        @asynccontextmanager
        async def connect():
            agent_end, control_end = memory_link_pair()
            await send_links.send(control_end)
            try:
                yield agent_end
            finally:
                with trio.move_on_after(1.0, shield=True):
                    await agent_end.aclose()

        try:
            async with trio.open_nursery() as nursery:
                box.update(token=trio.lowlevel.current_trio_token(), scope=nursery.cancel_scope,
                           links=receive_links)
                nursery.start_soon(run_agent_restarting, config, connect)
                ready.set()
        except BaseException as exc:  # reported by the test: the agent must never end by itself
            box["errors"].append(exc)
            raise

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(60)
    yield box
    if thread.is_alive():
        trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
    thread.join(10)


def _harmless(message: pb.ControlMessage) -> pb.ControlMessage:
    """`message` with every directory and URL pointed at nowhere (see the module docstring)."""
    kind = message.WhichOneof("body")
    if kind == "agent_settings":
        settings_ = message.agent_settings
        settings_.weights_dir = settings_.engines_dir = ""
        del settings_.mirrors[:]
    elif kind == "start_shard":
        for weights in message.start_shard.weights:
            weights.source = NOWHERE + "/model.gguf"
    elif kind == "install_engine":
        message.install_engine.archive_url = NOWHERE + "/engine.tar.gz"
    elif kind == "registered":  # a refusal ends the agent by design (tests/control/test_older_agents.py)
        message.registered.refusal = ""
    return message


async def _stream(box: dict):
    """The agent's current stream, waiting for it to (re)connect and register; answered with Registered."""
    if box["link"] is None:
        link = await box["links"].receive()
        first = await link.receive()
        assert first.WhichOneof("body") == "register", first
        await link.send(control_message(registered=pb.Registered(node_id="fuzzed", control_plane_version="0.1.0")))
        box["link"] = link
    return box["link"]


async def _exchange(box: dict, sent: list[pb.ControlMessage]) -> None:
    with trio.fail_after(EXAMPLE_SECONDS):
        link = await _stream(box)
        for message in sent:
            try:
                await link.send(message)
            except WireError:
                box["link"] = None  # the agent closed the stream (a Restart): it connects again
                break
        while True:  # still alive: it answers a log request (over a new stream if it reconnected); asked again
            link = await _stream(box)  # each second, since an agent drops messages while its outbox is full
            try:
                await link.send(control_message(request_logs=pb.RequestLogs(request_id="alive", lines=1)))
                with trio.move_on_after(1.0):
                    async for message in link:
                        if message.WhichOneof("body") == "log_lines" and message.log_lines.request_id == "alive":
                            return
                    box["link"] = None  # the stream ended
            except WireError:
                box["link"] = None


def _run(agent: dict, examples: int) -> None:
    @given(sent=st.lists(messages(pb.ControlMessage).map(_harmless), max_size=5))
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def check(sent) -> None:
        trio.from_thread.run(_exchange, agent, sent, trio_token=agent["token"])
        assert not agent["errors"], agent["errors"]

    check()


def test_any_control_message_leaves_the_agent_running(agent):
    _run(agent, FAST_EXAMPLES)


@pytest.mark.slow
def test_any_control_message_leaves_the_agent_running_over_many_streams(agent):
    _run(agent, SLOW_EXAMPLES)
