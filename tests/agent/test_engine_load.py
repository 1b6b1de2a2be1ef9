"""What the agent reads of its engines' /metrics: only ready shards, with the replica key from the engine's
environment, and nothing (never zeros) from an engine that refuses, has no --metrics, or is gone. Engines here
are the llama-server stand-in on loopback (tests/support/fake_llama_server.py), which guards /metrics as
llama-server does."""

from __future__ import annotations

import sys
from pathlib import Path

from llmgw.agent.engine_load import read_engine_loads
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.engines import llamacpp
from llmgw.identity import ShardState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_llama_server import FakeLlamaServer  # noqa: E402
from serving_process import free_port  # noqa: E402

KEY = "sk-replica-key-51"


def view(shard_id: str, port: int, state: ShardState = ShardState.READY, key: str | None = KEY) -> ShardView:
    env = {llamacpp.API_KEY_ENV: key} if key else {}
    return ShardView(shard_id, state, spec=ShardSpec(shard_id=shard_id, argv=(), port=port, env=env,
                                                     engine="llama.cpp@b11434"))


async def test_only_ready_engines_that_answer_with_the_key_are_read(nursery):
    engine = FakeLlamaServer(api_key=KEY)
    engine.stats.prompt_tokens, engine.stats.predicted_tokens = 42, 7
    port = await nursery.start(engine.serve, "127.0.0.1", 0)
    no_metrics = await nursery.start(FakeLlamaServer(api_key=KEY, metrics=False).serve, "127.0.0.1", 0)
    loads = await read_engine_loads([
        view("ready/0", port),
        view("starting/0", port, ShardState.STARTING),     # not ready: not asked
        view("keyless/0", port, key=None),                  # 401 without the replica key
        view("no-metrics/0", no_metrics),                   # started without --metrics: 501
        view("gone/0", free_port()),                        # nothing listens
    ])
    assert set(loads) == {"ready/0"}
    load = loads["ready/0"]
    assert (load.prompt_tokens_total, load.generation_tokens_total) == (42, 7)
    assert (load.requests_running, load.requests_waiting) == (0, 0)
    assert load.prefix_cache_hits_total is None  # llama.cpp has no such series
    assert engine.stats.requests["/metrics"] == 2  # the ready shard and the keyless one; never the starting one
