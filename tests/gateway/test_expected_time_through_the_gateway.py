"""Routing by expected completion time on live requests: a model whose catalog says `routing: expected-time` sends
requests to its fast replica until that one is full (its slots all busy), then to the slow one; each decision is
counted as "expected-time". Stand-in engines answer over real HTTP with vLLM's captured completion, held until the
test lets them answer; the official openai SDK is the client."""

from __future__ import annotations

from dataclasses import replace

import openai
import trio
from gateway_harness import ReplayEngine, make_table, replica, start_gateway, start_replay, vllm_capture

from llmgw.identity import Routing
from llmgw.routes import ReplicaSpeed

from test_precise_routing_through_the_gateway import decisions

FAST = ReplicaSpeed(prefill_tokens_per_second=20000.0, decode_tokens_per_second=2000.0, slots=2, source="bench")
SLOW = ReplicaSpeed(prefill_tokens_per_second=200.0, decode_tokens_per_second=20.0, slots=2, source="bench")


class HeldEngine(ReplayEngine):
    """Answers each POST once `release` is set; `arrived` counts the requests that reached it."""

    def __init__(self, release: trio.Event):
        super().__init__(200, vllm_capture("completion_0.json"))
        self.release = release
        self.arrived = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            self.arrived += 1
            await self.release.wait()
        return await super().__call__(scope, receive, send)


async def test_the_fast_replica_takes_requests_until_full_then_the_slow_one(nursery, store):
    release = trio.Event()
    engines = [HeldEngine(release), HeldEngine(release)]
    urls = [await start_replay(nursery, engine) for engine in engines]
    replicas = [replica("fast", urls[0], speed=FAST), replica("slow", urls[1], speed=SLOW)]
    table = make_table({"gemma": replicas})
    table = replace(table, models={"gemma": replace(table.models["gemma"], routing=Routing.EXPECTED_TIME)})
    gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    sdk = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    served: list[str] = []

    async def ask() -> None:
        answer = await sdk.completions.with_raw_response.create(model="gemma", prompt="Say hi", max_tokens=4)
        served.append(answer.headers["x-llmgw-replica"])

    async with trio.open_nursery() as clients:
        for wanted in ([1, 0], [2, 0], [2, 1]):  # one at a time, each held in flight before the next is sent
            clients.start_soon(ask)
            with trio.fail_after(10):
                while [e.arrived for e in engines] != wanted:
                    await trio.sleep(0.01)
        release.set()
    assert sorted(served) == ["fast", "fast", "slow"]
    assert decisions(gateway) == {"expected-time": 3.0}
