"""Helpers shared by the agent tests: the engine stand-in's command line and polling for a condition."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from llmgw.agent.shards import ShardSpec

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
