"""The official `anthropic` SDK through the gateway to the real llama-server (b11434) serving SmolLM2 135M Instruct
(the demo's chat model), and `/v1/rerank` to a real llama-server started with `--reranking`.

No reranking-trained GGUF ships in a PyPI package (the ones listed there download their weights from a hub at run
time, which this machine cannot reach), so the rerank server runs SmolLM2 itself with `--reranking`: llama-server's
real rerank path (rank pooling of the last token, no classifier head), scores without meaning. The test asserts the
shape, the usage and what the gateway adds, not the order of the documents.
"""

from __future__ import annotations

import dataclasses

import anthropic
import httpx
import pytest
from gateway_harness import make_table, replica, start_gateway
from support.serving_process import free_port, serving_process

pytestmark = pytest.mark.slow
ENGINE_KEY = "real-engine-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
GREEDY = {"temperature": 0, "seed": 42}  # engine fields, sent as extra body fields (the SDK of 2026 has none)


def _llama_server(binary, gguf, tmp_path_factory, *extra: str):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return url, serving_process(
        [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "2", *extra],
        {"LLAMA_API_KEY": ENGINE_KEY}, tmp_path_factory.mktemp("llama") / "server.log", url,
        what="llama-server", limit=60)


@pytest.fixture(scope="module")
def chat_server(llama_server_binary, smollm2_gguf, tmp_path_factory):
    """llama-server serving SmolLM2 with its own chat template (jinja); yields its base URL."""
    url, process = _llama_server(llama_server_binary, smollm2_gguf, tmp_path_factory, "-c", "2048", "--parallel", "2",
                                 "--jinja")
    with process:
        yield url


@pytest.fixture(scope="module")
def rerank_server(llama_server_binary, smollm2_gguf, tmp_path_factory):
    """llama-server started with --reranking (see the module docstring); yields its base URL."""
    url, process = _llama_server(llama_server_binary, smollm2_gguf, tmp_path_factory, "-c", "1024", "--reranking")
    with process:
        yield url


@pytest.fixture
async def sdk(nursery, store, chat_server):
    table = make_table({"smollm2-135m-instruct": [replica("smollm2-1", chat_server, replica_key=ENGINE_KEY)]},
                       aliases={"smollm2-135m-instruct": ("smollm2",)})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    return anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=plaintext, max_retries=0)


async def test_smollm2_answers_the_anthropic_sdk_whole_and_streamed_and_counts_tokens(sdk, store):
    whole = await sdk.messages.create(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    assert "Paris" in whole.content[0].text and whole.model == "smollm2" and whole.usage.input_tokens > 5
    async with sdk.messages.stream(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens and final.stop_reason == whole.stop_reason
    counted = await sdk.messages.count_tokens(model="smollm2", messages=QUESTION)
    assert abs(counted.input_tokens - whole.usage.input_tokens) <= 3, (counted, whole.usage)
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [
        (0, 0), (final.usage.input_tokens, final.usage.output_tokens),
        (whole.usage.input_tokens, whole.usage.output_tokens)]
    assert records[1].ttft_seconds is not None


async def test_smollm2_calls_a_tool_and_reads_its_result_through_the_translation(sdk):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = await sdk.messages.create(model="smollm2", max_tokens=60, messages=ask, tools=TOOLS,
                                     tool_choice={"type": "any"}, extra_body=GREEDY)
    [block] = [b for b in call.content if b.type == "tool_use"]
    assert block.name == "get_weather" and isinstance(block.input, dict) and call.stop_reason == "tool_use"
    async with sdk.messages.stream(model="smollm2", max_tokens=60, messages=ask, tools=TOOLS,
                                   tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        streamed = await stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (block.type, block.name, block.input)]
    answer = await sdk.messages.create(model="smollm2", max_tokens=30, tools=TOOLS, extra_body=GREEDY, messages=[
        *ask, {"role": "assistant", "content": [block.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "Sunny, 21 C"}]}])
    assert answer.content and answer.usage.output_tokens > 0


async def test_rerank_through_the_gateway_to_a_reranking_llama_server(nursery, store, rerank_server):
    table = make_table({"smollm2-rank": [replica("rank-1", rerank_server, replica_key=ENGINE_KEY)]})
    table = dataclasses.replace(table, models={"smollm2-rank": dataclasses.replace(
        table.models["smollm2-rank"], rerank=True, engine="llama.cpp")})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    documents = ["Paris is the capital of France.", "Bananas are yellow.", "Git tracks versions of files."]
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}, timeout=60) as http:
        answer = await http.post("/rerank", json={"model": "smollm2-rank", "query": "capital of France",
                                                  "documents": documents, "top_n": 2})
        assert answer.status_code == 200, answer.text
        ranked = answer.json()
        assert ranked["model"] == "smollm2-rank" and len(ranked["results"]) == 2
        assert {r["index"] for r in ranked["results"]} <= {0, 1, 2}
        assert all(isinstance(r["relevance_score"], float) for r in ranked["results"])
        score = await http.post("/score", json={"model": "smollm2-rank", "text_1": "a", "text_2": "b"})
        assert score.status_code == 400  # llama-server has no /v1/score
    [record, refused] = store.recent_usage()[::-1]
    assert record.status == 200 and record.prompt_tokens == ranked["usage"]["prompt_tokens"] > 0
    assert refused.status == 400
