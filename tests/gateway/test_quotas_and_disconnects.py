"""Quotas under concurrency and clients that leave mid-stream, with the real SQLite store."""

from __future__ import annotations

import time

import httpx
import openai
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway

from llmgw.gateway.token_bounds import prompt_token_bound

MAX_TOKENS = 10


async def test_64_concurrent_requests_never_overspend_tokens_per_minute(
        nursery, store):
    _engine, url = await start_engine(nursery)
    limit = 300
    projects = {"chat": ProjectPolicy("chat", "research", "acme",
                                      quotas=(("project:chat", Quota(tokens_per_minute=limit)),
                                              ("team:research", Quota()),))}
    # settle_wait long enough that every answer's usage is in the store when its response ends, however loaded the
    # machine: this test reads the store right after the burst (the spool's deferred writes have tests of their own)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                    projects=projects), settle_wait=30.0)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await client.chat.completions.create(model="gemma", max_tokens=MAX_TOKENS,
                                                 messages=[{"role": "user", "content": f"question number {i:03d}"}])
            outcomes.append("ok")
        except openai.RateLimitError as error:
            assert error.response.headers["x-ratelimit-limit-tokens"] == str(limit)
            assert int(error.response.headers["retry-after"]) >= 1
            outcomes.append("429")

    async with trio.open_nursery() as burst:
        for i in range(64):
            burst.start_soon(one, i)
    records = store.recent_usage(limit=100)
    admitted = [r for r in records if r.status == 200]
    # each reserves its prompt's bound (never below the engine's count) and max_tokens: 73 tokens
    reserved = prompt_token_bound({"messages": [{"role": "user", "content": "question number 000"}]}) + MAX_TOKENS
    spent = sum(r.prompt_tokens + r.completion_tokens for r in admitted)
    assert outcomes.count("ok") == len(admitted) and outcomes.count("429") == 64 - len(admitted) > 0
    assert len(admitted) >= limit // reserved  # the burst used the minute's tokens (settled ones free some more)
    assert spent <= limit  # never one token more


async def test_aborted_streams_leave_no_slot_held_and_bill_what_was_generated(nursery, store):
    engine, url = await start_engine(nursery, token_delay=0.05)
    projects = {"chat": ProjectPolicy("chat", "t", "o",
                                      quotas=(("project:chat", Quota(concurrent_requests=2)),))}
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                   projects=projects))
    _key, plaintext = store.create_api_key("chat")
    body = {"model": "gemma", "stream": True, "max_tokens": 15,
            "messages": [{"role": "user", "content": "tell me a long story"}]}
    for _round in range(3):
        async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}) as raw:
            async def leave_after_three_chunks() -> None:
                async with raw.stream("POST", "/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    seen = 0
                    async for line in response.aiter_lines():
                        seen += line.startswith("data: ")
                        if seen == 4:  # role chunk + 3 tokens
                            return  # leaving the block closes the connection mid-stream

            async with trio.open_nursery() as both:
                both.start_soon(leave_after_three_chunks)
                both.start_soon(leave_after_three_chunks)
        with trio.fail_after(5):
            while gateway.balancer.outstanding or engine.stats.processing:
                await trio.sleep(0.02)
    # both slots are free: two requests at once are admitted
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    async with trio.open_nursery() as both:
        for _ in range(2):
            both.start_soon(lambda: client.chat.completions.create(model="gemma", max_tokens=2,
                                                                   messages=body["messages"]))
    records = store.recent_usage(limit=20)
    aborted = [r for r in records if r.status == 499]
    assert len(aborted) == 6
    assert all(3 <= r.completion_tokens <= 5 and r.prompt_tokens > 0 for r in aborted)
    assert all(r.ttft_seconds is not None for r in aborted)
