"""Precise prefix routing on live requests: the gateway asks an engine's `/tokenize` for the prompt's tokens (vLLM
applies its own chat template), hashes them as vLLM does with the scheme the replicas report, and sends the request
to the replica whose engine holds the leading blocks, counting each decision by kind. Stand-in engines answer over
real HTTP with vLLM 0.32's captured shapes; the official openai SDK is the client."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import openai
from gateway_harness import ReplayEngine, make_table, replica, start_gateway, start_replay, vllm_capture

from llmgw.identity import Routing
from llmgw.routes import BlockSnapshot, ReplicaBlocks
from llmgw.tools.vllm_hashing import block_hashes

BLOCK = 16
PROMPT = "The sea is wide and the ships are many. " * 4  # 160 characters: 10 full blocks of the stand-in's tokens


def tokens_of(request: dict) -> list[int]:
    """The stand-in tokenizer: one token per character of the prompt, or of the chat messages' JSON."""
    text = request["prompt"] if "prompt" in request else json.dumps(request["messages"])
    return [ord(c) for c in text]


class TokenizingEngine(ReplayEngine):
    """Answers POST /tokenize as vLLM does (`{"count", "max_model_len", "tokens"}`, fixtures' tokenize.json) with
    `tokens_of`, or with `tokenize_status` and an error; every other POST with the captured completion."""

    def __init__(self, tokenize_status: int = 200):
        super().__init__(200, vllm_capture("completion_0.json"))
        self.tokenize_status = tokenize_status
        self.tokenized: list[dict] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/tokenize":
            return await super().__call__(scope, receive, send)
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(raw)
        self.tokenized.append(request)
        tokens = tokens_of(request)
        body = json.dumps({"count": len(tokens), "max_model_len": 2048, "tokens": tokens, "token_strs": None}
                          if self.tokenize_status == 200 else {"error": "boom"}).encode()
        await send({"type": "http.response.start", "status": self.tokenize_status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def holding(tokens: list[int], blocks: int) -> ReplicaBlocks:
    return ReplicaBlocks(frozenset(block_hashes(tokens, BLOCK, seed="0")[:blocks]), BLOCK, "sha256_cbor", "0")


def decisions(gateway) -> dict[str, float]:
    return {s.labels["kind"]: s.value for m in gateway.metrics.registry.collect()
            if m.name == "llmgw_gateway_routing_decisions" for s in m.samples if s.name.endswith("_total")}


async def _setup(nursery, store, engines, held, routing=Routing.PREFIX):
    urls = [await start_replay(nursery, e) for e in engines]
    replicas = [replica(f"r{i}", url) for i, url in enumerate(urls)]
    table = make_table({"gemma": replicas})
    table = replace(table, models={"gemma": replace(table.models["gemma"], routing=routing)})
    gateway, base = await start_gateway(nursery, store, table)
    gateway.set_blocks(BlockSnapshot({f"r{i}": blocks for i, blocks in held.items()}, version=1))
    _key, plaintext = store.create_api_key("chat")
    return gateway, base, plaintext


async def test_a_long_prompt_goes_to_the_replica_holding_its_leading_blocks(nursery, store):
    engines = [TokenizingEngine() for _ in range(3)]
    tokens = tokens_of({"prompt": PROMPT})
    held = {0: holding(tokens, 0), 1: holding(tokens, 3), 2: holding(tokens, 7)}
    gateway, base, key = await _setup(nursery, store, engines, held)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    for _ in range(4):
        answer = await sdk.completions.with_raw_response.create(model="gemma", prompt=PROMPT, max_tokens=4)
        assert answer.headers["x-llmgw-replica"] == "r2"
    assert [len(e.bodies) for e in engines] == [0, 0, 4]
    assert decisions(gateway) == {"precise": 4.0}
    asked = [r for e in engines for r in e.tokenized]
    assert asked == [{"model": "gemma", "prompt": PROMPT}] * 4


async def test_a_chat_is_tokenised_by_the_engine_with_its_template_fields_and_routed_on(nursery, store):
    engines = [TokenizingEngine(), TokenizingEngine()]
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hello"}]
    request = {"model": "gemma", "messages": messages, "add_generation_prompt": True}
    gateway, base, key = await _setup(nursery, store, engines,
                                      {0: holding(tokens_of(request), 5), 1: holding([], 0)})
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
        answer = await client.post(base + "/chat/completions", json={
            "model": "gemma", "messages": messages, "add_generation_prompt": True, "max_tokens": 4,
            "temperature": 0})
    assert answer.status_code == 200 and answer.headers["x-llmgw-replica"] == "r0"
    assert [r for e in engines for r in e.tokenized] == [request]


async def test_replicas_without_events_are_routed_by_the_approximate_policy_without_tokenising(nursery, store):
    quiet = [TokenizingEngine(), TokenizingEngine()]
    gateway, base, key = await _setup(nursery, store, quiet, {})
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    await sdk.completions.create(model="gemma", prompt=PROMPT, max_tokens=4)
    assert decisions(gateway) == {"approximate": 1.0} and not any(e.tokenized for e in quiet)


async def test_a_failing_tokenizer_turns_routing_back_to_the_approximate_policy(nursery, store):
    failing = [TokenizingEngine(tokenize_status=500), TokenizingEngine(tokenize_status=500)]
    tokens = tokens_of({"prompt": PROMPT})
    gateway, base, key = await _setup(nursery, store, failing, {0: holding(tokens, 5), 1: holding(tokens, 0)})
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    answer = await sdk.completions.create(model="gemma", prompt=PROMPT, max_tokens=4)
    assert answer.choices[0].text and decisions(gateway) == {"approximate": 1.0}
    assert sum(len(e.tokenized) for e in failing) == 1


async def test_a_prompt_shorter_than_half_a_block_is_not_tokenised(nursery, store):
    engines = [TokenizingEngine(), TokenizingEngine()]
    gateway, base, key = await _setup(nursery, store, engines, {0: holding([], 0), 1: holding([], 0)})
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    await sdk.completions.create(model="gemma", prompt="hi", max_tokens=4)
    assert not any(e.tokenized for e in engines) and decisions(gateway) == {"approximate": 1.0}


async def test_round_robin_sends_a_prompt_to_each_replica_in_turn_though_one_holds_its_blocks(nursery, store):
    engines = [TokenizingEngine() for _ in range(3)]
    tokens = tokens_of({"prompt": PROMPT})
    gateway, base, key = await _setup(nursery, store, engines, {0: holding(tokens, 0), 1: holding(tokens, 0),
                                                                 2: holding(tokens, 7)}, Routing.ROUND_ROBIN)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    served = [(await sdk.completions.with_raw_response.create(model="gemma", prompt=PROMPT, max_tokens=4)
               ).headers["x-llmgw-replica"] for _ in range(6)]
    assert served[:3] == served[3:] and sorted(served[:3]) == ["r0", "r1", "r2"]
    assert decisions(gateway) == {"round-robin": 6.0} and not any(e.tokenized for e in engines)


async def test_least_loaded_ignores_the_prompt_so_one_prompt_spreads_over_idle_replicas(nursery, store):
    engines = [TokenizingEngine(), TokenizingEngine()]
    tokens = tokens_of({"prompt": PROMPT})
    gateway, base, key = await _setup(nursery, store, engines, {0: holding(tokens, 7), 1: holding(tokens, 0)},
                                      Routing.LEAST_LOADED)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    for _ in range(4):
        await sdk.completions.create(model="gemma", prompt=PROMPT, max_tokens=4)
    assert [len(e.bodies) for e in engines] == [2, 2]  # idle replicas tie; the rotation shares them
    assert decisions(gateway) == {"least-loaded": 4.0} and not any(e.tokenized for e in engines)
