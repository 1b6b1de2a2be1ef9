"""/v1/responses through the official `openai` SDK against llama-server stand-ins on loopback (fast suite): the
Response object and its event sequence, tool calls, state across replicas by previous_response_id, store false,
another project's id, bad input in OpenAI's 4xx shape, usage billed like chat, and a disconnect mid-stream billed.

The same against real llama-server replicas is in test_responses_real_llama_server.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
import trio
from gateway_harness import ProjectPolicy, make_table, replica, start_engine, start_gateway
from test_tool_call_indices import node_modules  # noqa: F401 (the pinned Node SDK, a session fixture)

from llmgw.gateway.responses import PURGE_INTERVAL, ResponsesApi
from llmgw.gateway.responses_chat import chat_request, context_items

NODE_SCRIPT = Path(__file__).with_name("node") / "responses_turns.cjs"
# No `strict`: the SDKs let a caller leave it out (OpenAI's schema lists it as required but nullable).
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}


@pytest.fixture
async def served(nursery, store):
    """Two stand-in replicas of one model, a gateway, and keys of two projects."""
    engines = [await start_engine(nursery) for _ in range(2)]
    projects = {name: ProjectPolicy(name, "t", "o") for name in ("chat", "other")}
    table = make_table({"gemma": [replica(f"g-{i}", url) for i, (_e, url) in enumerate(engines)]},
                       projects=projects)
    gateway, base = await start_gateway(nursery, store, table)
    keys = {name: store.create_api_key(name)[1] for name in projects}
    return base, keys, [engine for engine, _url in engines], gateway


def _sdk(base: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)


async def test_a_plain_response_is_served_stored_and_billed_like_chat(served, store):
    base, keys, engines, _gateway = served
    sdk = _sdk(base, keys["chat"])
    response = await sdk.responses.create(model="gemma", input="Say hi.", instructions="Be brief.",
                                          max_output_tokens=40)
    assert response.id.startswith("resp_") and response.status == "completed" and response.model == "gemma"
    assert response.output[0].type == "message" and response.output_text
    sent = [e.stats.bodies[-1] for e in engines if e.stats.bodies][0]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    assert sent["max_tokens"] == 40
    record = store.recent_usage()[0]
    assert (record.prompt_tokens, record.completion_tokens) == (response.usage.input_tokens,
                                                              response.usage.output_tokens)
    assert record.status == 200 and record.model == "gemma"
    again = await sdk.responses.retrieve(response.id)
    assert again.output_text == response.output_text and again.usage.total_tokens == response.usage.total_tokens


async def test_a_streamed_response_emits_the_event_sequence_and_is_stored(served, store):
    base, keys, _engines, _gateway = served
    sdk = _sdk(base, keys["chat"])
    events = [event async for event in await sdk.responses.create(model="gemma", input="Say hi.", stream=True)]
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == store.recent_usage()[0].completion_tokens
    assert (await sdk.responses.retrieve(final.id)).output_text == text


async def test_a_tool_call_comes_back_as_a_function_call_item_and_its_output_goes_on(served):
    base, keys, engines, _gateway = served
    sdk = _sdk(base, keys["chat"])
    first = await sdk.responses.create(model="gemma", input="Weather in Paris?", tools=[TOOL])
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)
    streamed = [e async for e in await sdk.responses.create(model="gemma", input="Weather in Paris?", tools=[TOOL],
                                                           stream=True)]
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments
    second = await sdk.responses.create(
        model="gemma", previous_response_id=first.id, tools=[TOOL], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output[0].type == "message"
    sent = max((e.stats.bodies[-1] for e in engines if e.stats.bodies), key=lambda b: len(b["messages"]))
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    assert sent["tools"][0]["function"]["name"] == "get_weather"


async def test_three_turns_by_previous_response_id_carry_the_whole_conversation_to_either_replica(served):
    base, keys, engines, _gateway = served
    sdk = _sdk(base, keys["chat"])
    turn = await sdk.responses.create(model="gemma", input="One.")
    answers = [turn.output_text]
    for text in ("Two.", "Three."):
        turn = await sdk.responses.create(model="gemma", input=text, previous_response_id=turn.id)
        answers.append(turn.output_text)
    bodies = [b for e in engines for b in e.stats.bodies]
    last = max(bodies, key=lambda b: len(b["messages"]))
    assert last["messages"] == [
        {"role": "user", "content": "One."}, {"role": "assistant", "content": answers[0]},
        {"role": "user", "content": "Two."}, {"role": "assistant", "content": answers[1]},
        {"role": "user", "content": "Three."}]


async def test_store_false_keeps_nothing_and_another_projects_id_is_404(served, store):
    base, keys, _engines, _gateway = served
    sdk, other = _sdk(base, keys["chat"]), _sdk(base, keys["other"])
    unstored = await sdk.responses.create(model="gemma", input="Say hi.", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.responses.create(model="gemma", input="Go on.", previous_response_id=unstored.id)
    assert refused.value.body["param"] == "previous_response_id"
    kept = await sdk.responses.create(model="gemma", input="Say hi.")
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(kept.id)
    with pytest.raises(openai.BadRequestError):
        await other.responses.create(model="gemma", input="Go on.", previous_response_id=kept.id)
    items = await sdk.responses.input_items.list(kept.id)
    assert [item.type for item in items.data] == ["message"]
    easy = await sdk.responses.create(model="gemma", input=[{"role": "user", "content": "Say hi."}])  # no type
    assert [(item.type, item.role) for item in (await sdk.responses.input_items.list(easy.id)).data] == [
        ("message", "user")]
    await sdk.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(kept.id)


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "gemma", "input": 5}, "input", "invalid_type"),
    ({"input": "hi"}, "model", "missing_required_parameter"),
    ({"model": "gemma", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
    ({"model": "gemma", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
    ({"model": "gemma", "input": "hi", "max_output_tokens": 10**9}, "max_output_tokens", None),
    ({"model": "gemma", "input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id",
     "previous_response_not_found"),
])
async def test_bad_input_is_a_4xx_in_openais_shape(served, body, param, code):
    base, keys, _engines, _gateway = served
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{base}/responses", json=body, headers={"authorization": f"Bearer {keys['chat']}"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    if code is not None:
        assert error["code"] == code


async def test_input_tokens_and_unknown_paths_answer_in_openais_shape(served):
    base, keys, _engines, _gateway = served
    headers = {"authorization": f"Bearer {keys['chat']}"}
    async with httpx.AsyncClient() as client:
        wrong = await client.get(f"{base}/responses/resp_x/nothing", headers=headers)
        method = await client.get(f"{base}/responses", headers=headers)
        anonymous = await client.get(f"{base}/responses/resp_x")
    assert (wrong.status_code, method.status_code, anonymous.status_code) == (404, 405, 401)
    assert all("error" in a.json() for a in (wrong, method, anonymous))


async def test_a_client_that_leaves_mid_stream_is_billed(nursery, store):
    engine, url = await start_engine(nursery, token_delay=0.05, max_tokens_default=64)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-0", url)]}))
    key = store.create_api_key("chat")[1]
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("POST", f"{base}/responses", headers={"authorization": f"Bearer {key}"},
                                 json={"model": "gemma", "input": "Go.", "stream": True,
                                       "max_output_tokens": 64}) as answer:
            deltas = 0
            async for line in answer.aiter_lines():
                deltas += line == "event: response.output_text.delta"
                if deltas == 3:
                    break
    for _ in range(100):
        if store.recent_usage():
            break
        await trio.sleep(0.05)
    record = store.recent_usage()[0]
    assert record.status == 499 and record.prompt_tokens > 0 and record.completion_tokens >= 3


async def test_the_node_sdk_creates_streams_continues_and_retrieves(served, node_modules):  # noqa: F811
    base, keys, _engines, _gateway = served
    done = await trio.run_process(["node", str(NODE_SCRIPT), base, keys["chat"], "gemma"], capture_stdout=True,
                                  capture_stderr=True, check=False, env={**os.environ, "NODE_PATH": str(node_modules)})
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    assert seen["first"]["status"] == "completed" and seen["first"]["text"] == seen["retrieved"]
    assert seen["types"][0] == "response.created" and seen["types"][-1] == "response.completed"
    assert "response.output_text.delta" in seen["types"]
    assert seen["second"]["previous"] == seen["first"]["id"]
    assert seen["second"]["input_tokens"] > seen["first"]["input_tokens"]


def test_reasoning_items_and_developer_messages_reach_chat_as_its_fields():
    items = context_items([{"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]}],
                          [{"type": "reasoning", "id": "rs_1", "summary": [],
                            "content": [{"type": "reasoning_text", "text": "thinking"}]},
                           {"type": "message", "role": "assistant", "id": "msg_1",
                            "content": [{"type": "output_text", "text": "Hi."}]}],
                          {"input": "Again."})
    chat = chat_request({"model": "m", "reasoning": {"effort": "low"}, "top_k": 5}, items)
    assert chat["messages"] == [{"role": "system", "content": "Rules."},
                                {"role": "assistant", "content": "Hi.", "reasoning_content": "thinking"},
                                {"role": "user", "content": "Again."}]
    assert chat["reasoning_effort"] == "low" and chat["top_k"] == 5


async def test_expired_responses_are_purged_at_start_and_every_hour(autojump_clock):
    purges: list[tuple[float, tuple]] = []

    async def call(function, *args):
        purges.append((trio.current_time(), args))
        return 0

    boundary = SimpleNamespace(call=call)
    api = ResponsesApi(SimpleNamespace(accounting=SimpleNamespace(boundary=boundary, store=SimpleNamespace(
        purge_responses=None))))
    with trio.move_on_after(3 * PURGE_INTERVAL + 1):
        await api.purge_expired_periodically()
    assert [when for when, _args in purges] == [0.0, PURGE_INTERVAL, 2 * PURGE_INTERVAL, 3 * PURGE_INTERVAL]
    assert all(args[0] is None for _when, args in purges)  # every project's expired rows, never a project's all


async def test_a_response_past_the_retention_reads_as_absent(nursery, store):
    _engine, url = await start_engine(nursery)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-0", url)]},
                                                                   responses_retention_seconds=0.3))
    sdk = _sdk(base, store.create_api_key("chat")[1])
    response = await sdk.responses.create(model="gemma", input="Say hi.")
    for _ in range(100):
        try:
            await sdk.responses.retrieve(response.id)
        except openai.NotFoundError:
            break
        await trio.sleep(0.05)
    else:
        raise AssertionError("the response was still served past its retention")
    assert store.purge_responses() == 1


async def test_a_project_not_allowed_the_model_is_refused_on_create_and_count(nursery, store):
    _engine, url = await start_engine(nursery)
    projects = {"chat": ProjectPolicy("chat", "t", "o", models=frozenset({"other"}))}
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-0", url)]},
                                                                   projects=projects))
    sdk = _sdk(base, store.create_api_key("chat")[1])
    with pytest.raises(openai.PermissionDeniedError):
        await sdk.responses.create(model="gemma", input="Say hi.")
    with pytest.raises(openai.PermissionDeniedError):
        await sdk.responses.input_tokens.count(model="gemma", input="Say hi.")
    assert [r.status for r in store.recent_usage()] == [403]
