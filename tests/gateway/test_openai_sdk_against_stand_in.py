"""The official openai SDK against the gateway in front of the llama-server stand-in."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import trio
from gateway_harness import ENGINE_KEY, ProjectPolicy, make_table, replica, start_engine, start_gateway

MESSAGES = [{"role": "user", "content": "Say something about deterministic text."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                          "parameters": {"type": "object",
                                                         "properties": {"location": {"type": "string"}}}}}]


@pytest.fixture
async def setup(nursery, store):
    engine, url = await start_engine(nursery)
    table = make_table({"gemma": [replica("gemma-1", url, upstream_model="/models/gemma.gguf")]},
                       aliases={"gemma": ("gemma-3",)})
    gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    return engine, gateway, base, client, plaintext


async def test_chat_by_alias_rewrites_model_upstream_and_sends_only_the_replica_key(setup, store):
    engine, _gateway, _base, client, plaintext = setup
    reply = await client.chat.completions.create(model="gemma-3", messages=MESSAGES, seed=7, temperature=0,
                                                 stop=["zulu"], response_format={"type": "text"}, logprobs=False)
    assert reply.model == "gemma-3"
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    sent, headers = engine.stats.bodies[-1], engine.stats.headers[-1]
    assert sent["model"] == "/models/gemma.gguf"
    assert (sent["seed"], sent["temperature"], sent["stop"], sent["logprobs"]) == (7, 0, ["zulu"], False)
    assert sent["response_format"] == {"type": "text"}
    assert headers["authorization"] == f"Bearer {ENGINE_KEY}"
    assert plaintext not in json.dumps(headers)
    [record] = store.recent_usage()
    assert (record.project, record.model, record.replica, record.node, record.status) == (
        "chat", "gemma", "gemma-1", "node-a", 200)
    assert (record.prompt_tokens, record.completion_tokens) == (reply.usage.prompt_tokens,
                                                                reply.usage.completion_tokens)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_chat_stream_has_the_usage_chunk_only_when_asked(setup, store, include_usage):
    _engine, _gateway, _base, client, _ = setup
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = [c async for c in await client.chat.completions.create(
        model="gemma", messages=MESSAGES, stream=True, **options)]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text.split())
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.choices and c.usage is None for c in chunks)
    [record] = store.recent_usage()
    assert record.completion_tokens == len(text.split()) and record.ttft_seconds is not None


async def test_completions_stream_and_not_return_the_same_text(setup, store):
    _engine, _gateway, _base, client, _ = setup
    whole = await client.completions.create(model="gemma", prompt="Once upon a time", max_tokens=12, seed=1)
    parts = [c async for c in await client.completions.create(model="gemma", prompt="Once upon a time",
                                                              max_tokens=12, seed=1, stream=True)]
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text
    assert all(c.usage is None for c in parts)  # the engine's finish-chunk usage is removed
    words = len(whole.choices[0].text.split())
    assert [r.completion_tokens for r in store.recent_usage()] == [words, words]


async def test_n_choices_keep_their_indices_apart_in_a_stream(setup):
    _engine, _gateway, _base, client, _ = setup
    texts: dict[int, str] = {}
    async for chunk in await client.chat.completions.create(model="gemma", messages=MESSAGES, n=3, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    whole = await client.chat.completions.create(model="gemma", messages=MESSAGES, n=3)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert len(set(texts.values())) == 3


async def test_tool_call_deltas_pass_intact(setup):
    _engine, _gateway, _base, client, _ = setup
    calls: dict[int, dict] = {}
    finish = None
    async for chunk in await client.chat.completions.create(model="gemma", messages=MESSAGES, tools=TOOLS,
                                                            tool_choice="auto", stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": "", "id": None})
                entry["id"] = entry["id"] or call.id
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    whole = await client.chat.completions.create(model="gemma", messages=MESSAGES, tools=TOOLS)
    [expected] = whole.choices[0].message.tool_calls
    assert finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": expected.function.arguments, "id": expected.id}}
    assert json.loads(calls[0]["arguments"])["location"]


async def test_embeddings_pass_through(setup, store):
    _engine, _gateway, _base, client, _ = setup
    result = await client.embeddings.create(model="gemma", input=["one two", "three"])
    assert [d.index for d in result.data] == [0, 1] and len(result.data[0].embedding) == 16
    assert store.recent_usage()[0].prompt_tokens == 3


async def test_models_lists_only_what_the_project_may_use_with_aliases(nursery, store):
    _engine, url = await start_engine(nursery)
    projects = {"chat": ProjectPolicy("chat", "t", "o", models=frozenset({"gemma"}))}
    table = make_table({"gemma": [replica("g-1", url)], "llama": [replica("l-1", url)]},
                       aliases={"gemma": ("gemma-3",)}, projects=projects)
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    assert sorted([m.id async for m in client.models.list()]) == ["gemma", "gemma-3"]
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(model="llama", messages=MESSAGES)
    # a query parameter does not change which model is checked
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(model="llama", messages=MESSAGES, extra_query={"model": "gemma"})


async def test_each_error_status_raises_the_sdks_matching_exception(setup, store, nursery):
    _engine, gateway, base, client, plaintext = setup
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=base, api_key="sk-llmgw-nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="/models/gemma.gguf", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="gemma", messages=MESSAGES,
                                             extra_body={"pad": "x" * (11 * 1024 * 1024)})
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}) as raw:
        bad = await raw.post("/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        missing = await raw.post("/chat/completions", json={"messages": MESSAGES})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
        by_header = await raw.get("/models", headers={"authorization": "", "api-key": plaintext})
        assert by_header.status_code == 200
    table = gateway.table
    gateway.set_table(make_table({"gemma": []}))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "5"
    gateway.set_table(make_table({"gemma": list(table.models["gemma"].replicas)}, stopped=True))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert info.value.status_code == 503 and info.value.code == "system_stopped"
    # nothing listens on the replica's port: 502 after trying
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    gateway.set_table(make_table({"gemma": [replica("dead-1", dead)]}))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert info.value.status_code == 502
    statuses = sorted(r.status for r in store.recent_usage())
    assert statuses == [404, 502, 503, 503]  # refusals once the model is known are recorded too


async def test_a_refused_replica_is_retried_elsewhere_and_ejected(nursery, store):
    engine, url = await start_engine(nursery)
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    table = make_table({"gemma": [replica("dead-1", dead), replica("live-1", url)]})
    gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    for i in range(4):  # distinct prompts, so prefix affinity does not keep them on one replica
        await client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": f"q{i}"}])
    assert {r.replica for r in store.recent_usage()} == {"live-1"}
    assert gateway.balancer.is_ejected("dead-1", trio.current_time())
    assert engine.stats.requests["/v1/chat/completions"] == 4


async def test_engine_failure_mid_stream_ends_it_with_an_error_event(nursery, store):
    _engine, url = await start_engine(nursery, fail_after_chunks=3)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    received = []
    with pytest.raises(openai.APIError):
        async for chunk in await client.chat.completions.create(model="gemma", messages=MESSAGES, stream=True):
            received.append(chunk)
    assert len(received) == 4  # role chunk + 3 tokens
    [record] = store.recent_usage()
    assert record.status == 502 and record.completion_tokens == 3


async def test_an_engine_silent_mid_stream_past_the_idle_timeout_ends_it_with_an_error_event(nursery, store):
    from llmgw.gateway.upstream import Timeouts

    _engine, slow = await start_engine(nursery, token_delay=5.0)
    _engine, steady = await start_engine(nursery, token_delay=0.1)
    _gateway, base = await start_gateway(nursery, store, make_table({"slow": [replica("s-1", slow)],
                                                                     "steady": [replica("t-1", steady)]}),
                                         timeouts=Timeouts(idle_timeout=1.0))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    # tokens 0.1 s apart for 1.6 s in all: the idle timeout counts silence between reads, not the stream's length
    steady_chunks = [c async for c in await client.chat.completions.create(
        model="steady", messages=MESSAGES, stream=True, max_tokens=16)]
    steady_tokens = sum(1 for c in steady_chunks if c.choices and c.choices[0].delta.content)
    assert steady_tokens >= 12
    received = []
    with pytest.raises(openai.APIError, match="sent nothing for 1 s"):
        async for chunk in await client.chat.completions.create(model="slow", messages=MESSAGES, stream=True):
            received.append(chunk)
    assert len(received) == 2  # the role chunk and the first token; the next would come after 5 s of silence
    records = {r.model: r for r in store.recent_usage()}
    assert records["steady"].status == 200 and records["steady"].completion_tokens == steady_tokens
    assert records["slow"].status == 504 and records["slow"].completion_tokens == 1


async def test_a_429_is_retried_by_the_sdk_after_retry_after(nursery, store):
    from gateway_harness import Quota

    _engine, url = await start_engine(nursery, token_delay=0.05)
    projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(concurrent_requests=1)),))}
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                   projects=projects))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=2)
    holder = await client.chat.completions.create(model="gemma", messages=MESSAGES, stream=True, max_tokens=12)
    began = time.monotonic()

    async def finish_holder():
        async for _ in holder:
            pass

    nursery.start_soon(finish_holder)
    reply = await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert reply.choices[0].message.content
    assert time.monotonic() - began >= 0.9  # waited Retry-After (1 s) at least once
    metrics = gateway.metrics.render().decode()
    assert 'llmgw_gateway_quota_rejections_total{limit="concurrent_requests",project="chat"}' in metrics
    assert 'status="429"' in metrics


async def test_metrics_count_requests_tokens_and_ready_replicas_and_are_not_on_the_api_port(setup):
    _engine, gateway, base, client, _ = setup
    await client.chat.completions.create(model="gemma", messages=MESSAGES)
    async with httpx.AsyncClient() as raw:
        assert (await raw.get(base.removesuffix("/v1") + "/metrics")).status_code == 404  # issue 19 item 4
    text = gateway.metrics.render().decode()
    assert 'llmgw_gateway_requests_total{model="gemma",project="chat",status="200"} 1.0' in text
    assert 'llmgw_gateway_ready_replicas{model="gemma"} 1.0' in text
    assert "llmgw_gateway_prompt_tokens_total" in text and "llmgw_gateway_requests_in_flight" in text


async def test_a_revoked_key_is_refused_once_the_key_cache_expires(nursery, store):
    _engine, url = await start_engine(nursery)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}),
                                         key_cache_seconds=0.2)
    key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    await client.chat.completions.create(model="gemma", messages=MESSAGES)
    store.revoke_api_key(key.key_id)
    await trio.sleep(0.3)
    with pytest.raises(openai.AuthenticationError) as info:
        await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert "revoked" in info.value.message
