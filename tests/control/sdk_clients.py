"""A client of the gateway as an application writes one: the official openai SDK with retries off, sending chat
completions one after the other until told to stop, streamed or not; for the tests of a roll that must lose nothing
(tests/control/test_replica_drain.py, test_replica_drain_real.py)."""

from __future__ import annotations

import itertools

import httpx
import openai
import trio

_IDS = itertools.count()


async def sdk_client(client: openai.AsyncOpenAI, n: int, done: trio.Event, answered: list[str], failed: list[str],
                     **ask) -> None:
    """Send chat completions through `client` (`ask`: model, max_tokens, ...), streamed when `n` is odd, until
    `done` is set. Each carries its own `x-request-id` ("client-<n>-<k>"), added to `answered` once answered in full
    (a stream with its finish reason), else to `failed` with the error (with retries off, a 502 or 503 is one)."""
    messages = [{"role": "user", "content": f"Client {n} asks: name a colour."}]
    while not done.is_set():
        request_id = f"client-{n}-{next(_IDS)}"
        try:
            reply = await client.chat.completions.create(messages=messages, stream=bool(n % 2),
                                                         extra_headers={"x-request-id": request_id}, **ask)
            if n % 2:
                finish = None
                async with reply as stream:
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
            else:
                finish = reply.choices[0].finish_reason if reply.choices[0].message.content is not None else None
        except (openai.APIError, httpx.HTTPError) as exc:
            failed.append(f"{request_id}: {type(exc).__name__}: {exc}")
            continue
        if finish is None:
            failed.append(f"{request_id}: answered without a finish reason or without text")
            continue
        answered.append(request_id)
