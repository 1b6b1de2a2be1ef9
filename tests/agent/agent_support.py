"""Helpers shared by the agent tests: the engine stand-in's command line and polling for a condition."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from llmgw.agent.shards import ShardSpec
from support.stand_ins import python_tool

STANDIN = Path(__file__).with_name("engine_standin.py")


def standin_spec(shard_id: str, port: int, **env: str) -> ShardSpec:
    """A ShardSpec running the stand-in engine on `port` with extra environment `env`."""
    return ShardSpec(
        shard_id=shard_id, argv=(sys.executable, str(STANDIN), "--port", str(port)), port=port,
        env=env, threads=2, engine="standin@1", replica_id=shard_id.split("/")[0], model="standin",
        grace_seconds=5.0,
    )


async def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    """Poll `predicate()` until it returns a true value (returned), failing the test after `timeout` seconds."""
    with trio.fail_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await trio.sleep(interval)


FAKE_LLAMA_SERVER = Path(__file__).resolve().parents[1] / "support" / "fake_llama_server.py"


def fake_engine_binary(directory: Path) -> Path:
    """An executable `llama-server` in `directory` that runs the gateway's llama-server stand-in."""
    return python_tool(directory / "llama-server", FAKE_LLAMA_SERVER)


def tiny_mirror(directory: Path, content: bytes = b"GGUF not really a model") -> tuple[Path, str]:
    """A weights mirror holding one file by digest: (mirror directory, sha256)."""
    import hashlib

    digest = hashlib.sha256(content).hexdigest()
    (directory / "sha256").mkdir(parents=True, exist_ok=True)
    (directory / "sha256" / digest).write_bytes(content)
    return directory, digest


class ControlSide:
    """The control plane's end of in-process links: each `connect()` makes a new pair and hands its control end to
    the test through `links` (so a test can drop a connection and see the agent come back)."""

    def __init__(self):
        self._send, self.links = trio.open_memory_channel(10)

    def connect(self):
        from contextlib import asynccontextmanager

        from llmgw.wire import memory_link_pair

        @asynccontextmanager
        async def opened():
            agent_end, control_end = memory_link_pair()
            await self._send.send(control_end)
            async with agent_end:
                yield agent_end

        return opened()


async def serve_grpc_control_side(nursery) -> tuple[int, trio.MemoryReceiveChannel]:
    """A real gRPC agents service on 127.0.0.1:0 in `nursery` whose every agent stream is handed to the test:
    (its port, a channel receiving each stream's control end)."""
    from llmgw.wire import serve_agents

    links_send, links = trio.open_memory_channel(2)

    async def handler(link, peer):
        await links_send.send(link)
        await trio.sleep_forever()

    return await nursery.start(serve_agents, handler, "127.0.0.1", 0), links


async def next_matching(link, predicate, timeout: float = 20.0):
    """Read messages from `link` until `predicate(message)` is true; return that message."""
    with trio.fail_after(timeout):
        while True:
            message = await link.receive()
            if predicate(message):
                return message
