"""A hypothesis fuzzer of OpenAI request bodies against the served gateway and the llama-server stand-in.

Any answer but a 2xx or an OpenAI-shaped 4xx (`{"error": {"message": str, "type": str, "param": str|null,
"code": str|null}}`) is a failure (issue 19 item 10); on Anthropic's Messages API (`/messages`,
`/messages/count_tokens`), anything but a 2xx or Anthropic's `{"type": "error", "error": {"type", "message"}}`
(issue 31). Rerank, score and batch-creation bodies are fuzzed beside OpenAI's (OpenAI's error shape). The fast suite tries FAST_EXAMPLES bodies; the slow test
(`-m slow`, run in CI) SLOW_EXAMPLES. Bodies are mostly near-valid (right model, real roles and fields) with wrong
types, out-of-range numbers, NaN, unknown fields and random JSON mixed in, so both the refusals and the paths through
the engine (streams, n, tools, the quota reservation) are exercised.

The gateway and the engine run in a trio thread for the whole module; hypothesis drives them over HTTP from the
test's thread (one keep-alive connection), so each example costs a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading

import httpx
import pytest
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmgw.store import open_store

FAST_EXAMPLES = 60
SLOW_EXAMPLES = 1500
ENDPOINTS = ("/chat/completions", "/completions", "/embeddings", "/rerank", "/score")
ANTHROPIC = ("/messages", "/messages/count_tokens")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL with /v1, API key) of a gateway in front of the stand-in, served from a trio thread."""
    ready = threading.Event()
    box: dict = {}

    async def main() -> None:
        store = open_store(tmp_path_factory.mktemp("fuzz") / "store.db")
        _key, plaintext = store.create_api_key("chat")
        quotas = (("project:chat", Quota(tokens_per_day=10**12, concurrent_requests=64)),)
        async with trio.open_nursery() as nursery:
            _engine, url = await start_engine(nursery)
            table = make_table({"gemma": [replica("g-1", url)]}, aliases={"gemma": ("gemma-3",)},
                               projects={"chat": ProjectPolicy("chat", "t", "o", quotas=quotas)})
            table = dataclasses.replace(table, models={  # gemma reranks here too: /rerank reaches the engine
                "gemma": dataclasses.replace(table.models["gemma"], rerank=True, engine="llama.cpp")})
            _gateway, base = await start_gateway(nursery, store, table)
            box.update(base=base, key=plaintext, token=trio.lowlevel.current_trio_token(), scope=nursery.cancel_scope)
            ready.set()
        store.close()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(30), "the gateway did not start"
    with httpx.Client(base_url=box["base"], headers={"authorization": f"Bearer {box['key']}"},
                      timeout=30) as client:
        yield client
    trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
    thread.join(10)


# ---- strategies ----
leaves = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
          | st.text(max_size=12))
any_json = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
# valid bodies, with only values OpenAI's schema accepts (and engine extensions) ...
models = st.sampled_from(["gemma", "gemma-3"])
texts = st.text(max_size=40)
valid_common = {
    "max_tokens": st.none() | st.integers(1, 40), "n": st.none() | st.integers(1, 3),
    "temperature": st.none() | st.floats(0, 2), "top_p": st.none() | st.floats(0, 1),
    "seed": st.integers(0, 2**31), "stream": st.booleans(), "user": st.text(max_size=8),
    "stop": st.none() | st.text(max_size=5) | st.lists(st.text(max_size=5), min_size=1, max_size=4),
    "top_k": st.integers(1, 50), "cache_prompt": st.booleans(),
}
valid_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                       "content": texts | st.lists(st.fixed_dictionaries(
                                           {"type": st.just("text"), "text": texts}), min_size=1, max_size=2)})
valid_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.text("abcdefgh_", min_size=1, max_size=8)},
    optional={"parameters": st.just({"type": "object", "properties": {"city": {"type": "string"}}})})})
valid_chat = st.fixed_dictionaries(
    {"model": models, "messages": st.lists(valid_message, min_size=1, max_size=3)},
    optional={**valid_common, "max_completion_tokens": st.integers(1, 40), "tools": st.lists(valid_tool, max_size=1),
              "tool_choice": st.sampled_from(["auto", "none"]), "logprobs": st.booleans(),
              "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])})})
valid_prompts = (texts | st.lists(texts, min_size=1, max_size=3) | st.lists(st.integers(0, 50_000), min_size=1,
                 max_size=5) | st.lists(st.lists(st.integers(0, 50_000), min_size=1, max_size=3), min_size=1,
                                        max_size=2))
valid_completion = st.fixed_dictionaries({"model": models, "prompt": valid_prompts},
                                         optional={**valid_common, "echo": st.booleans()})
valid_embedding = st.fixed_dictionaries({"model": models, "input": valid_prompts},
                                        optional={"encoding_format": st.just("float"), "user": texts})


def _streaming_options(body: dict, include_usage: bool) -> dict:
    """OpenAI takes stream_options only with stream: true."""
    if body.get("stream") is True:
        return {**body, "stream_options": {"include_usage": include_usage}}
    return body


valid_rerank = st.fixed_dictionaries({"model": models, "query": texts, "documents": st.lists(texts, min_size=1,
                                                                                             max_size=3)},
                                     optional={"top_n": st.integers(1, 3), "return_documents": st.booleans()})
valid = (st.tuples(st.just("/chat/completions"), st.builds(_streaming_options, valid_chat, st.booleans()))
         | st.tuples(st.just("/completions"), st.builds(_streaming_options, valid_completion, st.booleans()))
         | st.tuples(st.just("/embeddings"), valid_embedding) | st.tuples(st.just("/rerank"), valid_rerank))

# ... then one field wrong (or dropped, or unknown), or the whole body any JSON at all
counts = st.integers(-3, 0) | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=3) | st.booleans()
bad_values = counts | any_json | st.lists(st.fixed_dictionaries({}, optional={"role": st.text(max_size=8),
                                                                             "content": any_json}), max_size=2)
fields = st.sampled_from(["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n",
                          "temperature", "top_p", "seed", "stream", "stream_options", "stop", "tools", "tool_choice",
                          "response_format", "logprobs", "top_logprobs", "best_of", "encoding_format", "dimensions",
                          "user"]) | st.text(max_size=8)


def _mutated(request: tuple, field: str, value, drop: bool) -> tuple:
    path, body = request
    body = {k: v for k, v in body.items() if k != field} if drop else {**body, field: value}
    return path, body


# /v1/batches (issue 32): near-valid creations (no such file: a 400 naming it), wrong fields, any JSON
batches = st.fixed_dictionaries({}, optional={
    "input_file_id": st.just("file-" + "0" * 24) | any_json, "metadata": st.just({"k": "v"}) | any_json,
    "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/moderations"]) | any_json,
    "completion_window": st.just("24h") | any_json})
requests = (valid | st.builds(_mutated, valid, fields, bad_values, st.booleans())
            | st.tuples(st.sampled_from(ENDPOINTS), any_json) | st.tuples(st.just("/batches"), batches | any_json))


# Anthropic's Messages API: near-valid bodies (text, images, tool use and results, tools), then one field wrong
blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("image"), "source": st.fixed_dictionaries(
        {"type": st.just("base64"), "media_type": st.just("image/png"), "data": st.just("iVBORw0KGgo=")})}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1"),
                           "content": texts | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                              "text": texts}), max_size=2)}),
    st.fixed_dictionaries({"type": st.sampled_from(["document", "thinking", "x"]), "text": texts}))
assistant_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_1"), "name": st.just("get_weather"),
                           "input": st.fixed_dictionaries({}, optional={"location": texts})}))
anthropic_turn = (st.fixed_dictionaries({"role": st.just("user"), "content": texts | st.lists(blocks, min_size=1,
                                                                                               max_size=3)})
                  | st.fixed_dictionaries({"role": st.just("assistant"), "content": texts | st.lists(
                      assistant_blocks, min_size=1, max_size=2)}))
anthropic_tool = st.fixed_dictionaries({"name": st.text("abcdefgh_", min_size=1, max_size=8)}, optional={
    "description": texts, "input_schema": st.just({"type": "object", "properties": {"location": {"type": "string"}}}),
    "type": st.sampled_from(["custom", "web_search_20250305"])})
valid_message = st.fixed_dictionaries(
    {"model": models, "max_tokens": st.integers(1, 40), "messages": st.lists(anthropic_turn, min_size=1, max_size=3)},
    optional={"system": texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                         max_size=2),
              "stream": st.booleans(), "temperature": st.floats(0, 1), "top_p": st.floats(0, 1),
              "top_k": st.integers(0, 50), "stop_sequences": st.lists(st.text(max_size=5), max_size=3),
              "tools": st.lists(anthropic_tool, max_size=2), "metadata": st.just({"user_id": "u"}),
              "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none", "tool"])},
                                                   optional={"name": st.just("get_weather")})})
anthropic_fields = st.sampled_from(["model", "max_tokens", "messages", "system", "stream", "temperature", "top_p",
                                    "top_k", "stop_sequences", "tools", "tool_choice", "metadata"]) | st.text(max_size=8)
anthropic_requests = (st.tuples(st.sampled_from(ANTHROPIC), valid_message)
                      | st.builds(_mutated, st.tuples(st.sampled_from(ANTHROPIC), valid_message), anthropic_fields,
                                  bad_values, st.booleans())
                      | st.tuples(st.sampled_from(ANTHROPIC), any_json))


def _is_anthropic_error(payload) -> bool:
    if not isinstance(payload, dict) or payload.get("type") != "error" or not isinstance(payload.get("error"), dict):
        return False
    error = payload["error"]
    return set(error) == {"type", "message"} and all(isinstance(error[k], str) and error[k] for k in error)


def _is_openai_error(payload) -> bool:
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return False
    error = payload["error"]
    return (isinstance(error.get("message"), str) and bool(error["message"]) and isinstance(error.get("type"), str)
            and set(error) == {"message", "type", "param", "code"}
            and all(error[k] is None or isinstance(error[k], str) for k in ("param", "code")))


def _check(client: httpx.Client, path: str, body) -> None:
    raw = json.dumps(body, allow_nan=True).encode()
    answer = client.post(path, content=raw, headers={"content-type": "application/json"})
    event(f"{path} {answer.status_code}")  # --hypothesis-show-statistics shows the mix
    if 200 <= answer.status_code < 300:
        if path == "/messages" and isinstance(body, dict) and body.get("stream") is True:
            assert "event: message_stop" in answer.text or "event: error" in answer.text, answer.text[-500:]
        return
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:500], raw[:500])
    shaped = _is_anthropic_error if path in ANTHROPIC else _is_openai_error
    assert shaped(answer.json()), (answer.text[:500], raw[:500])
    if answer.status_code == 400 and not _has_nonfinite(body):
        json.loads(raw)  # the body itself was JSON: the refusal was about its content


def _has_nonfinite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    return False


@settings(max_examples=FAST_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_fuzzed_openai_bodies_get_a_2xx_or_an_openai_shaped_4xx(served, request):
    _check(served, *request)


@settings(max_examples=FAST_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=anthropic_requests)
def test_fuzzed_anthropic_bodies_get_a_2xx_or_an_anthropic_shaped_4xx(served, request):
    _check(served, *request)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=anthropic_requests)
def test_many_fuzzed_anthropic_bodies_get_a_2xx_or_an_anthropic_shaped_4xx(served, request):
    _check(served, *request)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_many_fuzzed_openai_bodies_get_a_2xx_or_an_openai_shaped_4xx(served, request):
    _check(served, *request)
