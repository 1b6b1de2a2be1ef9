"""The openai SDK through the gateway to the real llama-server (b11434) serving Gemma 3 270M (the run's shared
engine, tests/support/shared_engines.py).

Gemma 270M is a base model: tests assert shapes, token counts and determinism (temperature 0, fixed seed).
"""

from __future__ import annotations

import time

import openai
import pytest
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_gateway
from shared_engines import ENGINES

pytestmark = pytest.mark.slow
ENGINE_KEY = ENGINES["shared_gemma"].key
MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture
def llama_server(shared_gemma) -> str:
    """The run's shared Gemma llama-server (tests/support/shared_engines.py: built-in gemma template, no jinja, two
    slots, 2,048 tokens of context, its key); its base URL."""
    return shared_gemma.base_url


@pytest.fixture
async def client(nursery, store, llama_server):
    projects = {"chat": ProjectPolicy("chat", "t", "o",
                                      quotas=(("project:chat", Quota(concurrent_requests=1)),))}
    table = make_table({"gemma-3-270m": [replica("gemma-3-270m-1", llama_server, replica_key=ENGINE_KEY)]},
                       aliases={"gemma-3-270m": ("gemma",)}, projects=projects)
    gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    return openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0), gateway


async def test_chat_stream_and_not_agree_and_usage_chunk_has_the_openai_shape(client, store):
    sdk, _gateway = client
    whole = await sdk.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=12, temperature=0,
                                              seed=42)
    assert whole.model == "gemma" and whole.usage.completion_tokens == 12 == len(store.recent_usage()) * 12
    chunks = [c async for c in await sdk.chat.completions.create(
        model="gemma", messages=MESSAGES, max_tokens=12, temperature=0, seed=42, stream=True,
        stream_options={"include_usage": True})]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    plain = [c async for c in await sdk.chat.completions.create(
        model="gemma", messages=MESSAGES, max_tokens=12, temperature=0, seed=42, stream=True)]
    assert all(c.choices and c.usage is None for c in plain)
    records = store.recent_usage()
    assert [r.completion_tokens for r in records] == [12, 12, 12]
    assert records[0].ttft_seconds is not None and records[0].replica == "gemma-3-270m-1"


async def test_completions_stream_and_not_with_n_choices(client, store):
    sdk, _gateway = client
    whole = await sdk.completions.create(model="gemma-3-270m", prompt="The capital of France is", max_tokens=6,
                                         temperature=0, seed=1, n=2)
    assert sorted(c.index for c in whole.choices) == [0, 1]
    texts: dict[int, str] = {}
    async for chunk in await sdk.completions.create(model="gemma-3-270m", prompt="The capital of France is",
                                                    max_tokens=6, temperature=0, seed=1, n=2, stream=True):
        assert chunk.usage is None
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {c.index: c.text for c in whole.choices}
    assert store.recent_usage()[0].completion_tokens == 12


async def test_engine_errors_and_gateway_errors_raise_the_matching_sdk_exceptions(client):
    sdk, gateway = client
    with pytest.raises(openai.BadRequestError):  # the engine's own 400 (prompt over -c 2048) passes through
        await sdk.chat.completions.create(model="gemma", max_tokens=2,
                                          messages=[{"role": "user", "content": "sea " * 3000}])
    with pytest.raises(openai.InternalServerError) as info:  # without --jinja llama-server answers tools with 500
        await sdk.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert info.value.status_code == 502 and "--jinja" in info.value.message
    with pytest.raises(openai.NotFoundError):  # the engine's own model path is not reachable
        await sdk.chat.completions.create(model="gemma-3-270m-q4_k_m.gguf", messages=MESSAGES)
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="sk-llmgw-x", max_retries=0).models.list()
    table = gateway.table
    wrong_key = replica("gemma-3-270m-1", table.models["gemma-3-270m"].replicas[0].base_url, replica_key="wrong")
    gateway.set_table(make_table({"gemma-3-270m": [wrong_key]}, projects=dict(table.projects)))
    with pytest.raises(openai.InternalServerError) as info:  # the engine refused our replica key: 502
        await sdk.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=2)
    assert info.value.status_code == 502


async def test_a_429_for_concurrency_is_retried_by_the_sdk(client, nursery):
    sdk, _gateway = client
    # Retry-After is 1 s. The retries are bounded by time, not by a count: on a loaded machine (issue 43: two CPU
    # burners on two cores) the first stream's 12 tokens took more than the 20 s that 20 retries gave it.
    retrying = sdk.with_options(max_retries=1000)
    long = await sdk.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=12, stream=True)

    async def drain():
        async for _ in long:
            pass

    nursery.start_soon(drain)
    began = time.monotonic()
    with trio.fail_after(180):
        reply = await retrying.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
    assert reply.usage.completion_tokens == 2 and time.monotonic() - began >= 0.9


async def test_an_aborted_real_stream_frees_the_slot(client, store):
    sdk, gateway = client
    stream = await sdk.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=200, stream=True)
    seen = 0
    async for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 3:
            break
    await stream.close()
    with trio.fail_after(5):
        while gateway.balancer.outstanding:
            await trio.sleep(0.05)
    reply = await sdk.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
    assert reply.usage.completion_tokens == 2
    aborted = [r for r in store.recent_usage() if r.status == 499]
    assert len(aborted) == 1 and 3 <= aborted[0].completion_tokens < 200 and aborted[0].prompt_tokens > 0


JAPANESE = "東京の天気について短い文章を書いてください。明日は晴れか、それとも雨が降るのですか。"  # 42 characters
BUDGET = 0.05
PRICE = 280.0  # per million tokens, prompt and completion alike


async def test_a_budget_is_never_overspent_by_concurrent_japanese_prompts(nursery, store, llama_server):
    """Issue 39: budget 0.05, five concurrent requests of a 42-character Japanese prompt. Guessed as characters / 4
    (18 tokens, the engine counts about 35) all five fitted the budget and the spend passed it. Reserved from the
    bound (`token_bounds`: 170 prompt tokens, 8 completion), one fits, the others are refused, the spend stays
    within the budget, and the engine's count is within the bound."""
    from dataclasses import replace

    from llmgw.gateway.token_bounds import prompt_token_bound

    messages = [{"role": "user", "content": JAPANESE}]
    projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(budget=BUDGET)),))}
    table = make_table({"gemma-3-270m": [replica("gemma-3-270m-1", llama_server, replica_key=ENGINE_KEY)]},
                       projects=projects)
    priced = replace(table.models["gemma-3-270m"], prompt_price_per_million=PRICE, completion_price_per_million=PRICE)
    _gateway, base = await start_gateway(nursery, store, replace(table, models={"gemma-3-270m": priced}))
    _key, plaintext = store.create_api_key("chat")
    sdk = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    outcomes: list = []

    async def ask():
        try:
            outcomes.append(await sdk.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=8,
                                                              temperature=0, seed=1))
        except openai.RateLimitError as refused:
            outcomes.append(refused)

    async with trio.open_nursery() as requests:
        for _ in range(5):
            requests.start_soon(ask)
    answered = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(answered) >= 1 and len(answered) + len(refused) == 5
    assert all(o.code == "insufficient_quota" for o in refused)
    bound = prompt_token_bound({"messages": messages})
    assert all(0 < o.usage.prompt_tokens <= bound for o in answered), [o.usage for o in answered]
    records = [r for r in store.recent_usage() if r.status == 200]
    spent = sum(r.cost for r in records)
    assert len(records) == len(answered) and 0 < spent <= BUDGET


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": JAPANESE}],
    [{"role": "system", "content": "Réponds en français, s'il te plaît."},
     {"role": "user", "content": "naïve café ☕️ 🚀 emoji and \u0000 control \t characters"},
     {"role": "assistant", "content": "D'accord."}, {"role": "user", "content": "<start_of_turn> " * 20}],
    [{"role": "user", "content": [{"type": "text", "text": "中文和한국어 mixed"}, {"type": "text", "text": "ok"}]}],
])
async def test_the_reserved_bound_is_never_below_the_engines_own_count(llama_server, messages):
    """`token_bounds.prompt_token_bound` against llama-server's count of the prompt its chat template makes."""
    import httpx

    from llmgw.gateway.token_bounds import prompt_token_bound

    headers = {"authorization": f"Bearer {ENGINE_KEY}"}
    async with httpx.AsyncClient(base_url=llama_server, headers=headers) as engine:
        prompt = (await engine.post("/apply-template", json={"messages": messages})).json()["prompt"]
        tokens = (await engine.post("/tokenize", json={"content": prompt, "add_special": True})).json()["tokens"]
    assert 0 < len(tokens) <= prompt_token_bound({"messages": messages})
