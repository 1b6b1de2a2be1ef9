"""/v1/responses and /v1/messages passed to a real llama-server's own endpoints (b11434 serves both:
`llmgw.gateway.native`), SmolLM2 135M Instruct with its chat template (`--jinja`; the run's shared engine), through
the official `openai` and `anthropic` SDKs: the answers in each dialect's shape with the gateway's ids and the
client's model name, the engine's usage billed, and a second turn by previous_response_id, which llama-server itself
refuses, served by the gateway sending the whole context.
"""

from __future__ import annotations

import dataclasses

import anthropic
import httpx
import openai
import pytest
from gateway_harness import make_table, replica, start_gateway
from shared_engines import ENGINES

pytestmark = pytest.mark.slow
ENGINE_KEY = ENGINES["shared_smollm2"].key
MODEL = ENGINES["shared_smollm2"].served_name
SEEDED = {"seed": 7}  # llama-server's own sampling field: repeatable answers (its /v1/responses passes it)
# its /v1/messages drops engine fields such as seed (server_chat_convert_anthropic_to_oai): top_k 1 repeats there


@pytest.fixture
def llama_server(shared_smollm2) -> str:
    """The run's shared SmolLM2 llama-server (jinja chat template; tests/support/shared_engines.py); its base URL."""
    return shared_smollm2.base_url


@pytest.fixture
async def base(nursery, store, llama_server):
    table = make_table({MODEL: [replica("smol-1", llama_server, replica_key=ENGINE_KEY)]})
    table = dataclasses.replace(table, models={MODEL: dataclasses.replace(table.models[MODEL], engine="llama.cpp")})
    _gateway, url = await start_gateway(nursery, store, table)
    return url, store.create_api_key("chat")[1]


async def test_responses_go_to_llama_servers_own_endpoint_and_a_second_turn_gets_the_whole_context(
        base, store, llama_server):
    url, key = base
    sdk = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    raw = await sdk.responses.with_raw_response.create(model=MODEL, input="What is the capital of France?",
                                                       max_output_tokens=16, extra_body=SEEDED)
    assert raw.headers["x-llmgw-engine-api"] == "/v1/responses"
    one = raw.parse()
    assert one.model == MODEL and one.output_text and one.usage.input_tokens > 5
    events = [e async for e in await sdk.responses.create(
        model=MODEL, input="And of Italy?", previous_response_id=one.id, max_output_tokens=16, stream=True,
        extra_body=SEEDED)]
    assert events[0].type == "response.created" and [e.sequence_number for e in events] == list(range(len(events)))
    two = events[-1].response
    assert events[-1].type == f"response.{two.status}"  # incomplete when cut at max_output_tokens
    assert two.previous_response_id == one.id and two.model == MODEL
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == two.output_text
    assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens  # the whole context went
    async with httpx.AsyncClient(base_url=llama_server, timeout=30,
                                 headers={"authorization": f"Bearer {ENGINE_KEY}"}) as engine:
        refused = await engine.post("/v1/responses", json={"model": MODEL, "input": "x",
                                                           "previous_response_id": one.id})
    assert refused.status_code == 400 and "previous_response_id" in refused.text  # what llama-server alone does
    stored = await sdk.responses.retrieve(two.id)
    assert stored.output_text == two.output_text
    await sdk.close()  # else the gateway's drain waits its graceful timeout (5 s) for the SDK's connection
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [
        (two.usage.input_tokens, two.usage.output_tokens), (one.usage.input_tokens, one.usage.output_tokens)]


async def test_a_native_answer_cut_at_max_output_tokens_is_incomplete_as_openais_is(base):
    url, key = base
    sdk = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    story = "Write a long story about a lighthouse keeper and his cat."
    cut = await sdk.responses.create(model=MODEL, input=story, max_output_tokens=16, extra_body=SEEDED)
    assert cut.usage.output_tokens == 16  # llama-server itself says "completed" here
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    events = [e async for e in await sdk.responses.create(model=MODEL, input=story, max_output_tokens=16,
                                                          stream=True, extra_body=SEEDED)]
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert (await sdk.responses.retrieve(cut.id)).status == "incomplete"  # stored as sent
    await sdk.close()


async def test_messages_go_to_llama_servers_own_endpoint_whole_and_streamed(base, store):
    url, key = base
    sdk = anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    raw = await sdk.messages.with_raw_response.create(model=MODEL, max_tokens=12, messages=question,
                                                      extra_body={"top_k": 1})
    assert raw.headers["x-llmgw-engine-api"] == "/v1/messages"
    whole = await raw.parse()
    assert whole.model == MODEL and whole.id.startswith("msg_") and whole.content[0].text
    async with sdk.messages.stream(model=MODEL, max_tokens=12, messages=question, extra_body={"top_k": 1}) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == whole.content[0].text and final.model == MODEL and final.usage.output_tokens > 0
    await sdk.close()  # else the gateway's drain waits its graceful timeout (5 s) for the SDK's connection

    def prompt(usage) -> int:  # Anthropic's input_tokens leaves out those read from the prefix cache
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [
        (prompt(final.usage), final.usage.output_tokens), (prompt(whole.usage), whole.usage.output_tokens)]
    assert records[0].ttft_seconds is not None and prompt(whole.usage) > 5
