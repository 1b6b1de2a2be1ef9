"""/v1/responses through the official `openai` SDK and the gateway to real llama-server replicas (b11434, Gemma 3
270M, its own chat template with `--jinja`): plain and streamed answers agree and bill the engine's usage, the
token count matches the engine's, and a three-turn
conversation by previous_response_id moves between two replicas with the first restarted in between.

Gemma 270M is a base model: the tests assert shapes, token counts and determinism (temperature 0), not wording.
"""

from __future__ import annotations

import openai
import pytest
from gateway_harness import make_table, replica, start_gateway
from llama_server_process import TEST_THREADS, running_llama_server
from serving_process import free_port, serving_process

from llmgw.engines import Launch, llamacpp

pytestmark = pytest.mark.slow
KEY = "sk-engine-responses-5c1e"
MODEL = "gemma-3-270m"
JINJA = ("--jinja",)


@pytest.fixture(scope="module")
def kept_replica(llama_server_binary, gemma_gguf, tmp_path_factory) -> str:
    """A llama-server that stays up for the module; yields its base URL."""
    port = free_port()
    argv, env = llamacpp.command_line(Launch(binary=llama_server_binary, model_path=gemma_gguf, port=port,
                                             threads=TEST_THREADS, context_size=2048, served_name=MODEL, api_key=KEY,
                                             engine_args=JINJA))
    url = f"http://127.0.0.1:{port}"
    with serving_process(argv, env, tmp_path_factory.mktemp("kept") / "server.log", url, what="llama-server",
                         limit=60):
        yield url


async def _gateway(nursery, store, *urls: str):
    table = make_table({MODEL: [replica(f"r-{i}", url, replica_key=KEY) for i, url in enumerate(urls)]})
    gateway, base = await start_gateway(nursery, store, table)
    return gateway, openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)


async def test_plain_and_streamed_responses_agree_bill_the_engines_usage_and_count_input_tokens(
        nursery, store, kept_replica):
    _gateway_, sdk = await _gateway(nursery, store, kept_replica)
    asked = {"model": MODEL, "input": "Write one sentence about the sea.", "max_output_tokens": 16,
             "temperature": 0}
    whole = await sdk.responses.create(**asked)
    assert whole.status in ("completed", "incomplete") and whole.output_text
    events = [e async for e in await sdk.responses.create(**asked, stream=True)]
    assert events[0].type == "response.created" and events[-1].type in ("response.completed",
                                                                       "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    final = events[-1].response
    assert final.usage.input_tokens == whole.usage.input_tokens
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [
        (final.usage.input_tokens, final.usage.output_tokens), (whole.usage.input_tokens, whole.usage.output_tokens)]
    counted = await sdk.responses.input_tokens.count(model=MODEL, input=asked["input"])
    assert counted.input_tokens == whole.usage.input_tokens


async def test_three_turns_by_previous_response_id_move_between_replicas_and_survive_a_restart(
        nursery, store, kept_replica, llama_server_binary, gemma_gguf, tmp_path):
    turns = ["Name a colour.", "Name another one.", "And a third?"]
    async with running_llama_server(llama_server_binary, gemma_gguf, tmp_path / "a.log", api_key=KEY,
                                    engine_args=JINJA) as first:
        gateway, sdk = await _gateway(nursery, store, first.base_url)
        one = await sdk.responses.create(model=MODEL, input=turns[0], max_output_tokens=16, temperature=0)
    gateway.set_table(make_table({MODEL: [replica("r-kept", kept_replica, replica_key=KEY)]}))
    two = await sdk.responses.create(model=MODEL, input=turns[1], previous_response_id=one.id, max_output_tokens=16,
                                     temperature=0)
    async with running_llama_server(llama_server_binary, gemma_gguf, tmp_path / "a-again.log", api_key=KEY,
                                    engine_args=JINJA, port=first.port) as again:
        gateway.set_table(make_table({MODEL: [replica("r-0", again.base_url, replica_key=KEY)]}))
        three = await sdk.responses.create(model=MODEL, input=turns[2], previous_response_id=two.id,
                                           max_output_tokens=16, temperature=0)
        explicit = await sdk.responses.create(model=MODEL, max_output_tokens=16, temperature=0, store=False, input=[
            {"role": "user", "content": turns[0]}, {"role": "assistant", "content": one.output_text},
            {"role": "user", "content": turns[1]}, {"role": "assistant", "content": two.output_text},
            {"role": "user", "content": turns[2]}])
    assert [r.replica for r in reversed(store.recent_usage())][:3] == ["r-0", "r-kept", "r-0"]
    assert one.usage.input_tokens < two.usage.input_tokens < three.usage.input_tokens
    assert three.usage.input_tokens == explicit.usage.input_tokens  # the same conversation, whole
    stored = store.load_response(three.id, "chat")
    assert stored is not None and len(stored.input) == 5 and stored.response["previous_response_id"] == two.id
