"""The official `anthropic` SDK through the gateway's Messages API to the llama-server stand-in: requests and tool
use translated both ways, Anthropic's stream events and error shapes, x-api-key, count_tokens, keys, the project's
allowlist, quotas and usage (a client that leaves mid-stream is still billed)."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway

MESSAGES = [{"role": "user", "content": "Say something about deterministic text."}]
TOOLS = [{"name": "get_weather", "description": "The weather at a place.",
          "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}}]


@pytest.fixture
async def setup(nursery, store):
    engine, url = await start_engine(nursery, token_delay=0.0)
    projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(tokens_per_day=10**9)),)),
                "narrow": ProjectPolicy("narrow", "t", "o", models=frozenset({"other"})),
                "tight": ProjectPolicy("tight", "t", "o", quotas=(("project:tight", Quota(requests_per_minute=1)),))}
    table = make_table({"gemma": [replica("gemma-1", url)], "other": [replica("other-1", url)]},
                       aliases={"gemma": ("gemma-3",)}, projects=projects)
    gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=plaintext, max_retries=0)
    return engine, gateway, base, client, plaintext


async def test_a_message_is_translated_to_chat_and_answered_as_anthropic_shapes_it(setup, store):
    engine, _gateway, _base, client, _ = setup
    reply = await client.messages.create(model="gemma-3", max_tokens=20, system="Be brief.", messages=MESSAGES,
                                         stop_sequences=["zulu"], metadata={"user_id": "u-1"},
                                         extra_body={"temperature": 0.5, "top_k": 5, "seed": 3})
    sent = engine.stats.bodies[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, *MESSAGES]
    assert (sent["max_tokens"], sent["temperature"], sent["stop"], sent["top_k"]) == (20, 0.5, ["zulu"], 5)
    assert sent["seed"] == 3 and "metadata" not in sent  # an engine's own field passes; Anthropic's only do not
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "gemma-3"
    assert reply.id.startswith("msg_") and [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.usage.output_tokens > 0
    [record] = store.recent_usage()
    assert (record.model, record.status, record.prompt_tokens, record.completion_tokens) == (
        "gemma", 200, reply.usage.input_tokens, reply.usage.output_tokens)


async def test_tool_use_and_tool_results_translate_both_ways_whole_and_streamed(setup):
    engine, _gateway, _base, client, _ = setup
    history = [*MESSAGES,
               {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
                   "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"location": "Oslo"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                            {"type": "text", "text": "And now?"}]}]
    reply = await client.messages.create(model="gemma", max_tokens=30, messages=history, tools=TOOLS,
                                         tool_choice={"type": "any", "disable_parallel_tool_use": True})
    sent = engine.stats.bodies[-1]
    assert sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather at a place.", "parameters": TOOLS[0]["input_schema"]}}]
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)
    assert sent["messages"][1] == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Oslo"}'}}]}
    assert sent["messages"][2:] == [{"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
                                    {"role": "user", "content": "And now?"}]
    [block] = reply.content
    assert block.type == "tool_use" and block.name == "get_weather" and set(block.input) == {"location"}
    assert reply.stop_reason == "tool_use"
    async with client.messages.stream(model="gemma", max_tokens=30, messages=history, tools=TOOLS) as stream:
        final = await stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [(block.type, block.name, block.input)]
    assert final.stop_reason == "tool_use"


async def test_a_stream_sends_anthropics_events_in_order_with_the_usage_at_the_end(setup, store):
    _engine, _gateway, base, client, plaintext = setup
    whole = await client.messages.create(model="gemma", max_tokens=12, messages=MESSAGES)
    events = [e async for e in await client.messages.create(model="gemma", max_tokens=12, messages=MESSAGES,
                                                             stream=True)]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == whole.content[0].text
    delta = events[-2]
    assert delta.delta.stop_reason == whole.stop_reason and delta.usage.output_tokens == whole.usage.output_tokens
    assert delta.usage.input_tokens == whole.usage.input_tokens
    records = store.recent_usage()
    assert records[0].completion_tokens == whole.usage.output_tokens and records[0].ttft_seconds is not None
    async with httpx.AsyncClient() as raw:  # the ping the SDK skips; x-api-key as Anthropic's clients send it
        answer = await raw.post(base + "/messages", headers={"x-api-key": plaintext, "anthropic-version": "2023-06-01"},
                                json={"model": "gemma", "max_tokens": 3, "messages": MESSAGES, "stream": True})
    names = [line[7:] for line in answer.text.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    assert answer.headers["content-type"].startswith("text/event-stream") and answer.headers["x-request-id"]


async def test_count_tokens_asks_the_engine_and_bills_nothing(setup, store):
    engine, _gateway, _base, client, _ = setup
    counted = await client.messages.count_tokens(model="gemma", messages=MESSAGES, system="Be brief.")
    assert counted.input_tokens > 0
    sent = engine.stats.bodies[-1]
    assert sent["model"] == "gemma" and sent["system"] == "Be brief." and sent["messages"] == MESSAGES
    [record] = store.recent_usage()
    assert (record.model, record.status, record.prompt_tokens, record.completion_tokens) == ("gemma", 200, 0, 0)


async def test_refusals_come_in_anthropics_error_shape_with_the_sdks_exceptions(setup, store):
    _engine, _gateway, base, client, plaintext = setup
    with pytest.raises(anthropic.NotFoundError) as info:
        await client.messages.create(model="nope", max_tokens=5, messages=MESSAGES)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="gemma", max_tokens=0, messages=MESSAGES)
    assert info.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in str(info.value.body)
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="gemma", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    assert "messages[0].content[0]" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as info:
        await client.with_options(api_key="sk-llmgw-wrong").messages.count_tokens(model="gemma", messages=MESSAGES)
    assert info.value.body["error"]["type"] == "authentication_error"
    key, revoked = store.create_api_key("chat")
    store.revoke_api_key(key.key_id)
    with pytest.raises(anthropic.AuthenticationError):
        await client.with_options(api_key=revoked).messages.create(model="gemma", max_tokens=5, messages=MESSAGES)
    _key, narrow = store.create_api_key("narrow")  # the project may use 'other' only
    for call in (client.with_options(api_key=narrow).messages.create(model="gemma", max_tokens=5, messages=MESSAGES),
                 client.with_options(api_key=narrow).messages.count_tokens(model="gemma", messages=MESSAGES)):
        with pytest.raises(anthropic.PermissionDeniedError) as info:
            await call
        assert info.value.body["error"]["type"] == "permission_error"
    _key, tight = store.create_api_key("tight")  # one request per minute
    await client.with_options(api_key=tight).messages.create(model="gemma", max_tokens=2, messages=MESSAGES)
    with pytest.raises(anthropic.RateLimitError) as info:
        await client.with_options(api_key=tight).messages.create(model="gemma", max_tokens=2, messages=MESSAGES)
    assert info.value.body["error"]["type"] == "rate_limit_error" and info.value.response.headers["retry-after"]
    async with httpx.AsyncClient() as raw:
        answer = await raw.post(base + "/messages", headers={"x-api-key": plaintext, "anthropic-version": "latest"},
                                json={"model": "gemma", "max_tokens": 3, "messages": MESSAGES})
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
        answer = await raw.get(base + "/messages", headers={"x-api-key": plaintext})
        assert answer.status_code == 405 and answer.json()["type"] == "error"
    assert {r.status for r in store.recent_usage()} >= {404, 403, 429}


async def test_a_client_that_leaves_mid_stream_is_billed_what_reached_the_engine(nursery, store):
    _engine, url = await start_engine(nursery, token_delay=0.05)
    table = make_table({"gemma": [replica("gemma-1", url)]})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=plaintext, max_retries=0)
    stream = await client.messages.create(model="gemma", max_tokens=200, messages=MESSAGES, stream=True)
    deltas = 0
    async for event in stream:
        deltas += event.type == "content_block_delta"
        if deltas == 2:
            break
    await stream.close()
    with trio.fail_after(5):
        while not store.recent_usage():
            await trio.sleep(0.02)
    [record] = store.recent_usage()
    assert record.status == 499 and record.prompt_tokens > 0 and record.completion_tokens >= 2


async def test_rerank_answers_for_models_that_rerank_with_keys_allowlist_and_usage(nursery, store):
    import dataclasses

    engine, url = await start_engine(nursery)
    projects = {"chat": ProjectPolicy("chat", "t", "o"),
                "narrow": ProjectPolicy("narrow", "t", "o", models=frozenset({"plain"}))}
    table = make_table({"ranker": [replica("ranker-1", url)], "plain": [replica("plain-1", url)]},
                       projects=projects)
    models = dict(table.models)
    models["ranker"] = dataclasses.replace(models["ranker"], rerank=True, engine="llama.cpp")
    gateway, base = await start_gateway(nursery, store, dataclasses.replace(table, models=models))
    _key, plaintext = store.create_api_key("chat")
    _key, narrow = store.create_api_key("narrow")
    body = {"model": "ranker", "query": "What is git?", "documents": ["a version control system", "a fish"]}
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}) as http:
        answer = await http.post("/rerank", json=body)
        assert answer.status_code == 200, answer.text
        ranked = answer.json()
        assert ranked["model"] == "ranker" and sorted(r["index"] for r in ranked["results"]) == [0, 1]
        [record] = store.recent_usage()
        assert (record.model, record.status, record.prompt_tokens) == ("ranker", 200, ranked["usage"]["prompt_tokens"])
        assert engine.stats.bodies[-1]["documents"] == body["documents"]
        answer = await http.post("/rerank", json={**body, "model": "plain"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "model_cannot_rerank"
        answer = await http.post("/score", json={"model": "ranker", "text_1": "a", "text_2": ["b", "c"]})
        assert answer.status_code == 400 and "/v1/rerank" in answer.json()["error"]["message"]
        answer = await http.post("/rerank", json={**body, "documents": "not a list"})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "documents"
        answer = await http.post("/rerank", json=body, headers={"authorization": f"Bearer {narrow}"})
        assert answer.status_code == 403 and answer.json()["error"]["type"] == "permission_error"
        answer = await http.post("/rerank", json=body, headers={"authorization": "Bearer sk-llmgw-wrong"})
        assert answer.status_code == 401
    assert [r.status for r in store.recent_usage()][:3] == [403, 400, 400]
    assert json.dumps(gateway.table.models["ranker"].rerank) == "true"
