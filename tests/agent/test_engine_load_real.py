"""The agent reads a real llama-server's own /metrics (b11434 with Gemma 3 270M, started with our command line:
`--metrics`, the replica key in its environment) into the load it reports for the replica, speed counters
included."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from llmgw.agent.engine_load import read_engine_loads
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.identity import ShardState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from llama_server_process import running_llama_server  # noqa: E402

KEY = "sk-engine-load-3c9e"


@pytest.mark.slow
async def test_a_real_llama_servers_counters_and_queue_are_read_with_its_key(llama_server_binary, gemma_gguf,
                                                                              tmp_path):
    async with running_llama_server(llama_server_binary, gemma_gguf, tmp_path / "engine.log",
                                    api_key=KEY) as engine:
        spec = ShardSpec(shard_id="gemma-0/0", argv=engine.argv, port=engine.port, env=engine.env,
                         engine="llama.cpp@b11434")
        view = ShardView("gemma-0/0", ShardState.READY, spec=spec)
        before = (await read_engine_loads([view]))["gemma-0/0"]
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client:
            reply = await client.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json={
                "model": "gemma-3-270m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        after = (await read_engine_loads([view]))["gemma-0/0"]
        # without the key the engine refuses: nothing is read, never zeros
        keyless = ShardView("gemma-0/0", ShardState.READY, spec=ShardSpec(
            shard_id="gemma-0/0", argv=spec.argv, port=engine.port, engine=spec.engine))
        assert await read_engine_loads([keyless]) == {}
    assert after.prompt_tokens_total - (before.prompt_tokens_total or 0) == usage["prompt_tokens"]
    assert after.generation_tokens_total - (before.generation_tokens_total or 0) == usage["completion_tokens"]
    assert (after.requests_running, after.requests_waiting) == (0, 0)
    assert after.kv_cache_usage is None  # b11434 publishes no KV-cache series
    assert after.prefix_cache_hits_total is None
    # the speed counters: the request's prompt and tokens, the time the engine took for them (its own timings)
    timings = reply.json()["timings"]
    assert after.prefill_tokens_total - before.prefill_tokens_total == timings["prompt_n"] == usage["prompt_tokens"]
    assert after.decode_tokens_total - before.decode_tokens_total == timings["predicted_n"]
    # the counters time the engine's batches, the timings the request's slot: a few ms apart on a loaded machine
    # (34.6 ms against 36.7 ms seen under a full suite run)
    assert after.prefill_seconds_total - before.prefill_seconds_total == pytest.approx(timings["prompt_ms"] / 1000,
                                                                                       rel=0.1, abs=0.01)
    assert after.decode_seconds_total - before.decode_seconds_total == pytest.approx(timings["predicted_ms"] / 1000,
                                                                                     rel=0.1, abs=0.01)
    assert after.steps_total > before.steps_total and after.busy_slots_per_step == pytest.approx(1.0)
