"""Malformed requests through the official openai SDK, against the gateway and the llama-server stand-in.

Regression tests for issue 19 defect 3 (bodies reached the engine unchecked: 502, 500 or even 200) and defect 4
(quota bypass through max_tokens/n the gateway could not read).
"""

from __future__ import annotations

from dataclasses import replace

import httpx
import openai
import pytest
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway

from llmgw.gateway.token_bounds import prompt_token_bound

USER = [{"role": "user", "content": "hi there"}]


@pytest.fixture
async def served(nursery, store):
    engine, url = await start_engine(nursery)
    projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(tokens_per_day=3000)),))}
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}, projects=projects))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    return engine, gateway, base, client, plaintext


CHAT_CLASSES = [
    ("empty messages", {"messages": []}, "messages"),
    ("message without a role", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("message with an unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("max_tokens a float", {"messages": USER, "max_tokens": 2.5}, "max_tokens"),
    ("max_tokens a string", {"messages": USER, "max_tokens": "40"}, "max_tokens"),
    ("max_tokens negative", {"messages": USER, "max_tokens": -3}, "max_tokens"),
    ("max_tokens past int64 with a quota", {"messages": USER, "max_tokens": 10**19}, "max_tokens"),
    ("n a string", {"messages": USER, "n": "3"}, "n"),
    ("temperature out of range", {"messages": USER, "temperature": 3.5}, "temperature"),
    ("stream_options without stream", {"messages": USER, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("tools not a list", {"messages": USER, "tools": {"type": "function"}}, "tools"),
    ("model name too long", {"messages": USER, "model": "g" * 300}, "model"),
]


@pytest.mark.parametrize(("what", "fields", "param"), CHAT_CLASSES, ids=[c[0] for c in CHAT_CLASSES])
async def test_the_sdk_raises_bad_request_with_param_for_each_malformed_chat_request(served, what, fields, param):
    engine, _gateway, _base, client, _ = served
    fields = {"model": "gemma", **fields}
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(**fields)
    assert info.value.param == param and info.value.type == "invalid_request_error"
    assert info.value.body["message"]
    assert "/v1/chat/completions" not in engine.stats.requests  # refused before any engine saw it


async def test_the_sdk_raises_bad_request_for_an_embeddings_request_without_input(served):
    engine, _gateway, _base, client, _ = served
    with pytest.raises(openai.BadRequestError) as info:
        await client.embeddings.create(model="gemma", input=None)
    assert (info.value.param, info.value.code) == ("input", "invalid_type")
    with pytest.raises(openai.BadRequestError) as info:
        await client.post("/embeddings", cast_to=object, body={"model": "gemma"})  # the SDK's typed call needs input
    assert (info.value.param, info.value.code) == ("input", "missing_required_parameter")
    assert not engine.stats.requests.get("/v1/embeddings")


@pytest.mark.parametrize(("raw", "code"), [
    (b'{"model": "gemma", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "invalid_number"),
    (b'{"model": "gemma", "messages": [{"role": "user", "content": "x"}], "top_p": 1e999}', "invalid_number"),
    (b'{"model": "gemma", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 100_000 + b"]" * 100_000
     + b"}", "json_too_deep"),
])
async def test_nan_infinity_and_deep_json_get_an_openai_shaped_400_not_a_500(served, raw, code):
    engine, _gateway, base, _client, plaintext = served
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}) as raw_client:
        answer = await raw_client.post("/chat/completions", content=raw,
                                       headers={"content-type": "application/json"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    assert "/v1/chat/completions" not in engine.stats.requests


async def test_unknown_fields_reach_the_engine_untouched(served):
    engine, _gateway, _base, client, _ = served
    await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5,
                                         extra_body={"top_k": 40, "cache_prompt": True,
                                                     "chat_template_kwargs": {"enable_thinking": False}})
    sent = engine.stats.bodies[-1]
    assert (sent["top_k"], sent["cache_prompt"], sent["chat_template_kwargs"]) == (40, True,
                                                                                   {"enable_thinking": False})


async def test_under_a_token_quota_the_engine_is_sent_the_reserved_max_tokens(served, store):
    engine, _gateway, _base, client, _ = served
    await client.chat.completions.create(model="gemma", messages=USER)  # no max_tokens: 256 reserved
    assert engine.stats.bodies[-1]["max_tokens"] == 256
    await client.chat.completions.create(model="gemma", messages=USER, max_completion_tokens=12, n=2)
    sent = engine.stats.bodies[-1]
    assert (sent["max_tokens"], sent["max_completion_tokens"], sent["n"]) == (12, 12, 2)
    await client.completions.create(model="gemma", prompt="once upon", max_tokens=7)
    assert engine.stats.bodies[-1]["max_tokens"] == 7


@pytest.mark.parametrize(("context_size", "n", "per_choice", "sent"), [
    (512, 1, 512, None),  # the engine stops at its context: reserved whole, not forced (the answer is not cut)
    (512, 2, 512, None),
    (None, 1, 256, 256),  # a context the gateway does not know: 256 forced and reserved, as before
])
async def test_without_max_tokens_the_models_context_is_reserved_and_the_engine_stops_there_itself(
        nursery, store, context_size, n, per_choice, sent):
    engine, url = await start_engine(nursery)
    table = make_table({"gemma": [replica("g-1", url)]}, projects={"chat": ProjectPolicy(
        "chat", "t", "o", quotas=(("project:chat", Quota(tokens_per_day=3000)),))})
    table = replace(table, models={"gemma": replace(table.models["gemma"], context_size=context_size)})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    answer = await client.chat.completions.with_raw_response.create(model="gemma", messages=USER, n=n)
    reserved = prompt_token_bound({"messages": USER}) + per_choice * n
    assert answer.headers["x-ratelimit-remaining-tokens"] == str(3000 - reserved)
    assert engine.stats.bodies[-1].get("max_tokens") == sent and engine.stats.bodies[-1].get("n", 1) == n
    assert len(answer.parse().choices) == n


async def test_without_token_limits_the_body_keeps_its_own_max_tokens(nursery, store):
    engine, url = await start_engine(nursery)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    await client.chat.completions.create(model="gemma", messages=USER)
    assert "max_tokens" not in engine.stats.bodies[-1]


async def test_max_tokens_or_n_the_gateway_cannot_read_are_refused_not_estimated_as_256(served, store):
    # issue 19 defect 4: "40" was reserved as 256 x 1 while the engine read it as 40 (and "3" choices as 3)
    engine, _gateway, _base, client, _ = served
    for fields in ({"max_tokens": "40"}, {"n": "3"}, {"max_completion_tokens": "900"}, {"max_tokens": True}):
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="gemma", messages=USER, **fields)
        assert info.value.param == next(iter(fields))
    assert "/v1/chat/completions" not in engine.stats.requests
    assert store.recent_usage() == []  # nothing reserved, nothing spent
