"""/v1/responses and /v1/messages passed to a vLLM engine's own endpoints (`llmgw.gateway.native`), through the
official `openai` and `anthropic` SDKs, against the in-process vLLM 0.32 stand-in (tests/support/vllm_dialects.py:
answers made by vLLM's own protocol classes, no capture of a real vLLM on these paths exists here).

What a user sees: the answer in the dialect's shape with the gateway's ids and their model name, the header naming
the engine path that served it, the engine's usage billed (cached tokens kept), a conversation by
previous_response_id whose whole context reaches the engine (which keeps nothing: `store: false`), a mid-stream
death ended with the dialect's failure event and billed, and translation for engines that do not serve the path.
"""

from __future__ import annotations

import dataclasses

import anthropic
import openai
import pytest
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, serve_asgi, start_engine, start_gateway
from vllm_dialects import VllmDialects

from llmgw.gateway.accounting import DEFAULT_MAX_TOKENS

TEXT = "The capital of France is Paris."


async def _until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


@pytest.fixture
async def served(nursery, store):
    """The vLLM stand-in behind a gateway whose route says engine vllm ("gemma") and sglang ("gemma-sglang"); the
    project "capped" has a token quota (the engine is held to the reserved max tokens). Drain timeout: 0.3 s."""
    engine = VllmDialects()
    url = f"http://127.0.0.1:{await nursery.start(serve_asgi, engine)}"
    projects = {"chat": ProjectPolicy("chat", "t", "o"),
                "capped": ProjectPolicy("capped", "t", "o", quotas=(("project:capped",
                                                                     Quota(tokens_per_minute=100000)),))}
    table = make_table({"gemma": [replica("v-1", url)], "gemma-sglang": [replica("s-1", url)]}, projects=projects)
    table = dataclasses.replace(table, models={
        "gemma": dataclasses.replace(table.models["gemma"], engine="vllm"),
        "gemma-sglang": dataclasses.replace(table.models["gemma-sglang"], engine="sglang")})
    gateway, base = await start_gateway(nursery, store, table, drain_timeout=0.3)
    keys = {name: store.create_api_key(name)[1] for name in projects}
    return engine, base, keys, gateway


async def test_a_response_is_passed_to_vllm_whole_and_streamed_billed_from_its_usage_and_stored(served, store):
    engine, base, keys, _gateway = served
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    raw = await sdk.responses.with_raw_response.create(model="gemma", input="What is the capital of France?",
                                                       max_output_tokens=32)
    assert raw.headers["x-llmgw-engine-api"] == "/v1/responses"
    whole = raw.parse()
    assert whole.output_text == TEXT and whole.model == "gemma" and whole.status == "completed"
    assert whole.id.startswith("resp_") and whole.id != "resp_5e2d8c1f0a9b4e7d9c6f3a2b1d0e8f7c"  # the gateway's
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (20, 7)
    assert whole.usage.input_tokens_details.cached_tokens == 16
    path, sent = engine.requests[-1]
    assert path == "/v1/responses" and sent["store"] is False and sent["model"] == "gemma"
    assert sent["input"] == [{"type": "message", "role": "user", "content": "What is the capital of France?"}]
    assert sent["max_output_tokens"] == 32 and "stream_options" not in sent

    events = [e async for e in await sdk.responses.create(model="gemma", input="And of Italy?", stream=True,
                                                          previous_response_id=whole.id)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = events[-1].response
    assert final.previous_response_id == whole.id and final.model == "gemma" and final.output_text == TEXT
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == TEXT
    path, sent = engine.requests[-1]
    assert "previous_response_id" not in sent and sent["store"] is False
    assert [item.get("role") for item in sent["input"]] == ["user", "assistant", "user"]
    assert sent["input"][1]["content"][0]["text"] == TEXT

    stored = await sdk.responses.retrieve(final.id)
    assert stored.output_text == TEXT and stored.usage.output_tokens == 7
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.status) for r in records] == [
        (20, 7, 16, 200), (20, 7, 16, 200)]
    assert records[0].ttft_seconds is not None


async def test_a_message_is_passed_to_vllm_whole_and_streamed_and_billed_from_its_usage(served, store):
    engine, base, keys, _gateway = served
    sdk = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=keys["capped"], max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    raw = await sdk.messages.with_raw_response.create(model="gemma", max_tokens=64, messages=question)
    assert raw.headers["x-llmgw-engine-api"] == "/v1/messages"
    whole = await raw.parse()
    assert whole.content[0].text == TEXT and whole.model == "gemma" and whole.id.startswith("msg_")
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens, whole.usage.output_tokens) == (4, 16, 7)
    path, sent = engine.requests[-1]
    assert path == "/v1/messages" and sent["messages"] == question and sent["max_tokens"] == 64
    async with sdk.messages.stream(model="gemma", max_tokens=64, messages=question) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == TEXT and final.id.startswith("msg_") and final.model == "gemma"
    assert final.usage.output_tokens == 7 and final.stop_reason == "end_turn"
    assert engine.requests[-1][0] == "/v1/messages" and "stream_options" not in engine.requests[-1][1]
    await sdk.close()  # else the gateway's drain waits its graceful timeout (5 s) for the SDK's connection
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.status) for r in records] == [
        (20, 7, 16, 200), (20, 7, 16, 200)]


async def test_an_engine_that_dies_mid_stream_ends_it_with_the_dialects_failure_and_is_billed(served, store):
    engine, base, keys, _gateway = served
    engine.stream_cut_after = 6  # created, in_progress, item added, part added, two deltas
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    events = [e async for e in await sdk.responses.create(model="gemma", input="Hi", stream=True)]
    assert events[-1].type == "response.failed" and events[-1].sequence_number == len(events) - 1
    assert events[-1].response.status == "failed"
    claude = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=keys["chat"], max_retries=0)
    engine.stream_cut_after = 4
    with pytest.raises(anthropic.APIStatusError):
        async with claude.messages.stream(model="gemma", max_tokens=16,
                                          messages=[{"role": "user", "content": "Hi"}]) as stream:
            [piece async for piece in stream.text_stream]
    await claude.close()
    await sdk.close()
    records = store.recent_usage()
    assert [r.status for r in records] == [502, 502]
    assert records[1].completion_tokens == 2 and records[1].prompt_tokens > 0  # two deltas came; prompt estimated
    assert records[0].prompt_tokens == 20  # message_start told the prompt


async def test_an_engine_that_does_not_serve_the_dialect_gets_it_translated_to_chat(served, store):
    engine, base, keys, _gateway = served
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    raw = await sdk.responses.with_raw_response.create(model="gemma-sglang", input="Hi", max_output_tokens=16)
    assert raw.headers["x-llmgw-engine-api"] == "/v1/chat/completions"
    assert engine.requests[-1][0] == "/v1/chat/completions" and raw.parse().model == "gemma-sglang"
    claude = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=keys["chat"], max_retries=0)
    answer = await claude.messages.create(model="gemma-sglang", max_tokens=8,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert engine.requests[-1][0] == "/v1/chat/completions" and answer.model == "gemma-sglang"
    await claude.close()
    await sdk.close()
    assert [r.status for r in store.recent_usage()] == [200, 200]


async def test_an_engine_build_without_the_native_path_gets_the_request_translated_and_billed_once(served, store):
    engine, base, keys, _gateway = served
    engine.without = {"/v1/responses", "/v1/messages"}  # a build before these paths: 404 at each
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    raw = await sdk.responses.with_raw_response.create(model="gemma", input="Hi", max_output_tokens=16)
    assert raw.headers["x-llmgw-engine-api"] == "/v1/chat/completions"
    assert [path for path, _ in engine.requests] == ["/v1/responses", "/v1/chat/completions"]
    whole = raw.parse()
    assert whole.model == "gemma" and whole.usage.output_tokens > 0 and whole.id.startswith("resp_")
    events = [e async for e in await sdk.responses.create(model="gemma", input="Again", previous_response_id=whole.id,
                                                          max_output_tokens=16, stream=True)]
    assert events[-1].type == "response.incomplete"  # the stand-in's chat answer ends at its length
    assert events[-1].response.previous_response_id == whole.id
    claude = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=keys["chat"], max_retries=0)
    answer = await claude.messages.create(model="gemma", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert answer.model == "gemma" and answer.id.startswith("msg_") and answer.usage.output_tokens > 0
    async with claude.messages.stream(model="gemma", max_tokens=8,
                                      messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert (await stream.get_final_message()).model == "gemma"
    await claude.close()
    await sdk.close()
    assert [path for path, _ in engine.requests][2:] == ["/v1/responses", "/v1/chat/completions",
                                                     "/v1/messages", "/v1/chat/completions",
                                                     "/v1/messages", "/v1/chat/completions"]
    assert [r.status for r in store.recent_usage()] == [200] * 4  # one row a request, none for the 404s


async def test_a_client_that_leaves_mid_stream_is_billed_its_prompt_and_the_deltas_it_got(served, store):
    engine, base, keys, _gateway = served
    engine.event_delay = 0.05
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    stream = await sdk.responses.create(model="gemma", input="What is the capital of France?", stream=True)
    deltas = 0
    async for event in stream:
        deltas += event.type == "response.output_text.delta"
        if deltas == 2:
            break
    await stream.close()
    await sdk.close()
    await _until(lambda: store.recent_usage())
    [record] = store.recent_usage()
    assert record.status == 499 and record.completion_tokens in (2, 3) and record.prompt_tokens > 0


async def test_the_drain_ends_native_streams_with_each_dialects_failure_and_bills_them(served, store):
    engine, base, keys, gateway = served
    engine.event_delay = 0.2  # 15 events: 3 s, past the drain timeout (0.3 s)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["chat"], max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=keys["chat"], max_retries=0)
    seen: dict[str, list] = {"responses": [], "messages": [], "gemma-sglang": []}
    refused: list[anthropic.APIStatusError] = []

    async def responses(model: str = "gemma", into: str = "responses") -> None:
        async for event in await sdk.responses.create(model=model, input="Hi", stream=True):
            seen[into].append(event)

    async def messages() -> None:
        try:
            async with claude.messages.stream(model="gemma", max_tokens=16,
                                              messages=[{"role": "user", "content": "Hi"}]) as stream:
                async for piece in stream.text_stream:
                    seen["messages"].append(piece)
        except anthropic.APIStatusError as error:
            refused.append(error)

    async with trio.open_nursery() as clients:
        clients.start_soon(responses)
        clients.start_soon(messages)
        clients.start_soon(responses, "gemma-sglang", "gemma-sglang")  # translated: the chat stream's relay
        await _until(lambda: any(e.type == "response.output_text.delta" for e in seen["responses"])
                     and seen["messages"] and any(e.type == "response.output_text.delta"
                                                  for e in seen["gemma-sglang"]))
        await gateway.drain()
    assert seen["responses"][-1].type == "response.failed" and "drain" in seen["responses"][-1].response.error.message
    assert seen["gemma-sglang"][-1].type == "response.failed"
    assert [e.sequence_number for e in seen["responses"]] == list(range(len(seen["responses"])))
    assert refused and "drain" in str(refused[0])
    records = store.recent_usage()
    assert sorted(r.status for r in records) == [503] * 3 and all(r.completion_tokens >= 1 for r in records), records
    await sdk.close()
    await claude.close()


async def test_llama_servers_short_events_are_completed_for_the_sdks_stream_helper(nursery, store):
    """The llama-server stand-in answers /v1/responses in b11434's shapes (no sequence numbers or indices, a short
    Response object) and refuses previous_response_id as b11434 does: the SDK's stream helper, which reads
    `output_index`, builds the response, and a second turn passes because the gateway sends the whole context."""
    engine, url = await start_engine(nursery)
    table = make_table({"smol": [replica("l-1", url)]})
    table = dataclasses.replace(table, models={"smol": dataclasses.replace(table.models["smol"], engine="llama.cpp")})
    _gateway, base = await start_gateway(nursery, store, table)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
    async with sdk.responses.stream(model="smol", input="Name a colour.", max_output_tokens=16) as stream:
        one = await stream.get_final_response()
    assert one.output_text and one.model == "smol" and one.usage.output_tokens > 0
    two = await sdk.responses.create(model="smol", input="Another?", previous_response_id=one.id)
    assert two.previous_response_id == one.id and two.output_text
    sent = engine.stats.bodies[-1]
    assert "previous_response_id" not in sent and sent["input"][1]["content"][0]["text"] == one.output_text
    await sdk.close()


async def test_a_project_with_a_token_quota_holds_the_native_engine_to_what_was_reserved(served, store):
    engine, base, keys, _gateway = served
    sdk = openai.AsyncOpenAI(base_url=base, api_key=keys["capped"], max_retries=0)
    await sdk.responses.create(model="gemma", input="Hi")  # no max_output_tokens: the default was reserved
    assert engine.requests[-1][1]["max_output_tokens"] == DEFAULT_MAX_TOKENS
    assert "max_tokens" not in engine.requests[-1][1]
    await sdk.close()
